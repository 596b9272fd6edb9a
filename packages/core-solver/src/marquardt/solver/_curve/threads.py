"""How many torch threads a fit on the CPU runs on, and a block that sets that count.

torch's intra-op pool splits each kernel between its threads, which wait for each other
at its end. A batched LM iteration is dozens of short kernels, so a second thread pays
only when each kernel has enough work, and only when a core is free to run it at once: on
a busy machine each kernel waits for the thread the scheduler let go, and a fit runs many
times slower than on one thread. The default is therefore one thread, and more only when
both the work per kernel and the idle cores allow (``choose_threads``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["BATCH_THREAD_WORK", "choose_threads", "idle_cores", "torch_threads"]

#: Elements of J per chunk (fits × N × P) from which ``curve_fit_batch`` tries more than
#: one thread: below it a second thread has never paid (benchmarks/RESULTS.md: 5 × 5
#: Gaussians, 1.25·10⁵ elements a chunk, 34,600 fits/s on one thread against 1,520 on
#: two; from 1.25·10⁶ on float32 two idle-ish threads gave 1.4×).
BATCH_THREAD_WORK = 1_000_000


def idle_cores(cores: int, load: float | None) -> int:
    """The cores free for this process: ``cores`` less the runnable threads the last
    minute's load average counts (rounded), at least 1; 1 when the load is unknown.

    This process's own earlier work counts as load, which errs toward fewer threads."""
    if load is None or not math.isfinite(load):
        return 1
    return max(1, min(cores, cores - round(load)))


def _machine() -> tuple[int, float | None]:
    """(cores this process may run on, the one-minute load average or None)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - Windows has no load average
        load = None
    return cores, load


def choose_threads(
    work: int,
    crossover: int,
    *,
    most: int | None = None,
    machine: tuple[int, float | None] | None = None,
) -> int:
    """The default torch thread count for a fit whose kernels each handle ``work`` elements.

    One thread when ``work < crossover`` (measured per caller: below it a second thread
    does not pay even on idle cores); else ``min(most, idle_cores(cores, load))``.

    **Arguments:**

    - ``work``, ``crossover``: the work per kernel and the measured crossover, in one unit.
    - ``most``: the most threads to use; default torch's setting (``torch.get_num_threads``,
      which honours ``OMP_NUM_THREADS``).
    - ``machine``: (the cores this process may run on, the one-minute load average or
      None where the system has none); read from the machine when not given.

    **Returns:** a thread count of at least 1.
    """
    if work < crossover:
        return 1
    cores, load = _machine() if machine is None else machine
    most = torch.get_num_threads() if most is None else most
    return max(1, min(most, idle_cores(cores, load)))


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` (None: left as it is) for a block."""
    threads = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count is not None:
            torch.set_num_threads(threads)
