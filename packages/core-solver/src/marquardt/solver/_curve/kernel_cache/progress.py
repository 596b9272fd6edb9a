"""What an inline compile says while it runs: what it compiles, that it is alive, how long
it is expected to take.

A compile inline (``compile=True``, or a call under ``"auto"`` that repays one) blocks the
call for tens of seconds. It says so on stderr, once per call: the model, the kernel being
compiled (the iteration with its start state, the covariance), the threads and the
expected time. On a terminal one line is rewritten every ``TICK`` seconds with the seconds
so far; elsewhere (a log) the line is written once and ended with the time taken, so that
a log holds one line per compiling call.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["TICK", "CompileProgress"]

#: Seconds between two refreshes of the progress line on a terminal.
TICK = 1.0


@dataclass
class CompileProgress:
    """The stderr line of one call's inline compiles.

    **Arguments:**

    - ``name``: the model's name; ``where``: its threads or device, in words.
    - ``expected``: the predicted seconds of the call's compiles.
    - ``stream``: where the line goes (default ``sys.stderr``, read at each write).
    """

    name: str
    where: str
    expected: float
    stream: TextIO | None = None
    started: float | None = None
    kind: str = "iteration"
    _stop: threading.Event = field(default_factory=threading.Event)

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def _terminal(self) -> bool:
        isatty = getattr(self._out(), "isatty", None)
        return bool(isatty and isatty())

    def _head(self) -> str:
        return (
            f"marquardt: compiling curve_fit_batch's {self.kind} for the model {self.name} "
            f"(on {self.where}; expected ~{self.expected:.0f} s), once for this machine; "
            "later runs load it ..."
        )

    @contextmanager
    def alive(self, kind: str) -> Iterator[None]:
        """Say that ``kind`` is compiled, for the block (module docstring).

        **Arguments:** ``kind``: the kernel: ``iteration`` or ``covariance``.

        **Returns:** (as a context manager) nothing; the line stays open for ``finish``.
        """
        self.kind = kind
        first = self.started is None
        if first:
            self.started = time.perf_counter()
        if not self._terminal():
            self._write(self._head() + " " if first else f"{kind} ... ")
            yield
            return
        self._stop.clear()
        ticker = threading.Thread(target=self._tick, name="marquardt-compile", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            self._stop.set()
            ticker.join()

    def _tick(self) -> None:
        while True:
            self._write(f"\r{self._head()} {self._seconds():.0f} s ")
            if self._stop.wait(TICK):
                return

    def _seconds(self) -> float:
        return 0.0 if self.started is None else time.perf_counter() - self.started

    def _write(self, text: str) -> None:
        out = self._out()
        out.write(text)
        out.flush()

    def finish(self, failed: bool, seconds: float) -> None:
        """End the line with the time the compiles took (nothing where none ran).

        **Arguments:** ``failed``: whether a compile failed (a warning says why);
        ``seconds``: the call's compile seconds.
        """
        if self.started is None:
            return
        done = "failed (see the warning) after" if failed else "compiled in"
        self._write(f"{done} {seconds:.1f} s\n")
        self.started = None


def where(device: Any, threads: int) -> str:
    """The threads (on the CPU) or the device, in words."""
    if getattr(device, "type", "cpu") == "cpu":
        return f"{threads} thread{'s' * (threads != 1)}"
    return str(device)
