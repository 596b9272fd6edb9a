"""Interrupts at random moments inside a piece of work, timed from its measured length."""

from __future__ import annotations

import _thread
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for a block: ``interrupt_main`` does nothing where
    SIGINT is ignored (a shell's background job inherits SIG_IGN)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupt_repeatedly(
    work: Callable[[], object],
    after: Callable[[bool], None],
    *,
    trials: int,
    seed: int,
    hits: int = 0,
    before: Callable[[], None] | None = None,
) -> tuple[int, int]:
    """Run ``work`` ``trials`` times, each with a KeyboardInterrupt fired after a delay drawn
    uniformly within the shortest of three measured runs; ``before()``, when given, notes
    the state before each, and ``after(hit)`` checks it after each. Any other exception escapes. On a busy machine more interrupts land after
    the work: the runs go on (up to four times ``trials``) until ``hits`` of them were
    interrupted. Returns how many runs were interrupted, and how many ran."""
    durations = []
    for _ in range(3):
        t0 = time.perf_counter()
        work()
        durations.append(time.perf_counter() - t0)
    typical = max(1e-3, min(durations))
    rng = random.Random(seed)
    interrupted = runs = 0
    with python_sigint():
        while runs < trials or (interrupted < hits and runs < 4 * trials):
            runs += 1
            if before is not None:
                before()
            timer = threading.Timer(rng.uniform(0.0, typical), _thread.interrupt_main)
            hit = False
            try:
                try:
                    timer.start()
                    work()
                finally:
                    timer.cancel()
                    timer.join()
                # An interrupt fired as the work returned is delivered at the interpreter's
                # next check: here, inside the try, never later in the test.
                time.sleep(0.005)
            except KeyboardInterrupt:
                hit = True
            interrupted += hit
            after(hit)
    return interrupted, runs
