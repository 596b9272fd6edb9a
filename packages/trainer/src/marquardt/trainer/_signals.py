"""SIGTERM: finish the step, write a checkpoint, exit cleanly; children that die with their parent.

Slurm sends SIGTERM before preemption and at the time limit (then SIGKILL after
``KillWait`` seconds); torchrun and a spawning parent forward it to their workers. The
handler only raises a flag: the training loop checks it after each step, agrees with the
other processes (one process asking is enough, so every rank stops at the same step),
writes a checkpoint and leaves with exit status 0. A requeued job (``sbatch --requeue``)
then resumes from that checkpoint. A second SIGTERM while the first is being honoured
means "now": the process exits at once with status 143.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import FrameType
from typing import Any

_Handler = Callable[[int, FrameType | None], Any] | int | None


class _SigtermHandler(ABC):
    """A SIGTERM handler that can be installed and put back (only from the main thread)."""

    def __init__(self) -> None:
        self._previous: _Handler = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def uninstall(self) -> None:
        """Put back the handler that was there before ``install``."""
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)
            self._installed = False

    @abstractmethod
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """What SIGTERM does while installed."""


class GracefulStop(_SigtermHandler):
    """A SIGTERM flag for the training loop (installed only in the main thread)."""

    def __init__(self, who: str = "trainer") -> None:
        super().__init__()
        self.who = who
        self.requested = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            sys.stderr.write(f"marquardt.trainer: {self.who}: second SIGTERM, exiting now\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.requested = True
        sys.stderr.write(
            f"marquardt.trainer: {self.who}: SIGTERM received; finishing the current step, then "
            "writing a checkpoint and exiting\n"
        )
        sys.stderr.flush()


class SignalForwarder(_SigtermHandler):
    """In a spawning parent: pass SIGTERM on to the training processes it started."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        super().__init__()
        self._pids = pids
        self.received = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def exit_with_parent(interval: float = 1.0) -> None:
    """In a spawned training process: exit as soon as the spawning parent is gone.

    A parent killed with SIGKILL cannot stop its children; without this they would train
    on (or wait in a collective) with nobody to report to. On Linux the kernel delivers
    SIGKILL when the parent dies (``PR_SET_PDEATHSIG``), which works even when the process
    is stuck in native code holding the GIL; elsewhere, and as a second line, a daemon
    thread notices the re-parenting and ends the process.
    """
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before the call took effect
                os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                sys.stderr.write(
                    f"marquardt.trainer: the spawning process {parent} is gone; exiting\n"
                )
                sys.stderr.flush()
                os._exit(1)

    threading.Thread(target=watch, name="marquardt-parent-watch", daemon=True).start()
