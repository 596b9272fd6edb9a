"""The thread rule applied to this process: torch's intra-op pool and the BLAS pools.

torch is imported only when `choose_threads`, `apply_threads` or `user_torch_threads` is
called (the
``torch`` extra); ``threadpoolctl``, where installed, limits the BLAS libraries already
loaded (NumPy's OpenBLAS or MKL; importing torch loads NumPy). A count the user set with
``torch.set_num_threads`` is told apart from torch's default by comparing with the counts
torch may start with (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``, else the physical cores of
the machine or of the process's affinity); a count this module set itself is never taken
for the user's.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from . import _settings
from ._threads import ThreadChoice, physical_cores, threads_per_process

#: The choice `apply_threads` last applied in this process (its count is not the user's).
_applied: dict[str, ThreadChoice] = {}


def torch_default_counts(env: dict[str, str] | None = None) -> set[int]:
    """The intra-op thread counts torch may start a process with on this machine.

    torch takes ``MKL_NUM_THREADS`` or ``OMP_NUM_THREADS`` where set, else the physical
    cores as its CPU library counts them: the machine's, or those of the process's CPU
    affinity (MKL's count), or the logical CPUs where the cores cannot be read.

    Arguments:
        env: the variables to read (default: this process's).

    Returns:
        The set of counts a process may start with (a count outside it was set).
    """
    env = _settings.thread_settings() if env is None else env
    for name in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        text = env.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            return {int(text)}
    counts = {physical_cores(), os.cpu_count() or 1}
    if hasattr(os, "sched_getaffinity"):
        cpus = set(os.sched_getaffinity(0))
        counts |= {physical_cores(cpus), len(cpus)}
    return counts


def user_torch_threads() -> int | None:
    """The count the user set with ``torch.set_num_threads`` in this process, if any.

    Returns:
        ``torch.get_num_threads()`` where it is none of the counts torch may start with
        (`torch_default_counts`) and not the count `apply_threads` set; ``None`` otherwise
        (a user's count equal to one of those cannot be told apart: set
        ``OMP_NUM_THREADS`` or the run's setting instead).
    """
    torch: Any = importlib.import_module("torch")
    current = int(torch.get_num_threads())
    ours = _applied.get("torch")
    if ours is not None and current == ours.threads:
        return current if ours.source == "torch.set_num_threads" else None
    return None if current in torch_default_counts() else current


def applied_threads() -> ThreadChoice | None:
    """The choice `apply_threads` applied in this process, while torch still runs its count.

    Returns:
        That `ThreadChoice`, or ``None`` (never applied, or the user changed the count since):
        a library that starts work in a process a launcher already set up keeps its choice.
    """
    if "torch" not in _applied:
        return None
    torch: Any = importlib.import_module("torch")
    choice = _applied["torch"]
    return choice if int(torch.get_num_threads()) == choice.threads else None


def _limit_blas(threads: int) -> bool:
    """Hold the loaded BLAS pools at ``threads`` (threadpoolctl); False where it is missing
    or the user set a BLAS variable."""
    env = _settings.thread_settings()
    if "MKL_NUM_THREADS" in env or "OPENBLAS_NUM_THREADS" in env:
        return False
    try:
        threadpoolctl: Any = importlib.import_module("threadpoolctl")
    except ImportError:
        return False
    threadpoolctl.threadpool_limits(limits=threads, user_api="blas")
    return True


def choose_threads(
    processes: int | None = None,
    requested: int | None = None,
    processes_from: str = "nprocs",
) -> ThreadChoice:
    """`threads_per_process`, except that a count the user set with ``torch.set_num_threads``
    in this process wins over the rule (not over ``requested`` or ``OMP_NUM_THREADS``).

    Arguments:
        processes: the processes sharing this process's cores (see `threads_per_process`).
        requested: a count the caller was given (a ``TrainConfig`` setting); wins.
        processes_from: how ``processes`` is named in the log.

    Returns:
        The `ThreadChoice`; nothing is changed in this process (see `apply_threads`).
    """
    choice = threads_per_process(processes, requested, processes_from)
    user = user_torch_threads() if choice.source == "rule" else None
    return choice if user is None else ThreadChoice(user, "torch.set_num_threads")


def apply_threads(choice: ThreadChoice) -> None:
    """Give torch's intra-op pool, and the BLAS pools, of this process ``choice.threads``.

    ``OMP_NUM_THREADS`` is left to torch and the BLAS libraries, which read it themselves;
    the BLAS pools are left alone where ``MKL_NUM_THREADS`` or ``OPENBLAS_NUM_THREADS`` is
    set or ``threadpoolctl`` is missing. Call it where a process starts its work, before
    the first kernel (a process group's collectives included).

    Arguments:
        choice: what `choose_threads` (here or in a spawning parent) chose.
    """
    if choice.source == "OMP_NUM_THREADS":
        return
    torch: Any = importlib.import_module("torch")
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    _applied["torch"] = choice
    _limit_blas(choice.threads)
