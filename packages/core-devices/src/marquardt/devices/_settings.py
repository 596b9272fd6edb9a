"""Every environment variable that ``marquardt.devices`` reads, with its meaning.

Nothing else in the package calls ``os.environ``: each variable is read here, when asked,
never at import, so a value changed by a launcher before the first call is honoured.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

#: name -> meaning, for documentation and for ``marquardt-devices --env``.
ENVIRONMENT: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": (
        "which GPUs CUDA (and so PyTorch) may use, and in which order: indices, GPU-UUIDs or "
        "unique prefixes of them, MIG- ids; empty or -1 hides every GPU; the first invalid "
        "entry ends the list"
    ),
    "CUDA_DEVICE_ORDER": (
        "FASTEST_FIRST (CUDA's default) or PCI_BUS_ID; NVML always enumerates in PCI bus "
        "order, so indices agree with CUDA's only under PCI_BUS_ID or on a machine of one "
        "GPU model"
    ),
    "LEGATE_CONFIG": (
        "flags for the Legate runtime, read once when it starts; its --gpus K says how many "
        "of the visible GPUs Legate takes (the first K)"
    ),
    "LEGATE_AUTO_CONFIG": (
        "0 turns off Legate's automatic configuration, which otherwise reserves every GPU "
        "when LEGATE_CONFIG names no --gpus"
    ),
    "LOCAL_RANK": "rank of this process on its node (torchrun, Lightning); shown by the CLI",
    "RANK": "global rank of this process (torchrun); shown by the CLI",
    "WORLD_SIZE": "number of processes in the job (torchrun); shown by the CLI",
    "SLURM_LOCALID": "rank of this task on its node under srun; LOCAL_RANK when that is unset",
    "SLURM_PROCID": "global rank of this task under srun; RANK when that is unset",
    "SLURM_NTASKS": "number of tasks in the Slurm step; WORLD_SIZE when that is unset",
    "SLURM_JOB_GPUS": (
        "GPU indices Slurm allocated to the job (Slurm also sets CUDA_VISIBLE_DEVICES); "
        "shown by the CLI to explain the visible set"
    ),
    "OMP_NUM_THREADS": (
        "threads of each process's OpenMP pools (torch's intra-op threads, OpenBLAS); when "
        "set, it wins over the thread rule (marquardt.devices.threads_per_process); torchrun "
        "sets 1 for its workers unless it is set"
    ),
    "MKL_NUM_THREADS": "threads of MKL's pool; when set, the thread rule leaves BLAS pools alone",
    "OPENBLAS_NUM_THREADS": (
        "threads of OpenBLAS's pool; when set, the thread rule leaves BLAS pools alone"
    ),
    "LOCAL_WORLD_SIZE": (
        "number of processes on this node (torchrun); the processes sharing this node's cores"
    ),
    "SLURM_NTASKS_PER_NODE": (
        "tasks per node of the Slurm step (srun --ntasks-per-node); the processes sharing "
        "this node's cores when LOCAL_WORLD_SIZE is unset"
    ),
    "SLURM_TASKS_PER_NODE": (
        "tasks on each node of the Slurm step, e.g. 2(x3),1 (always set by srun); the tasks "
        "on this node when SLURM_NTASKS_PER_NODE is unset"
    ),
    "SLURM_NODEID": (
        "index of this node in the Slurm allocation (which entry of SLURM_TASKS_PER_NODE)"
    ),
    "SLURM_CPUS_PER_TASK": (
        "CPUs Slurm gave each task (srun --cpus-per-task); the cores of this process's task, "
        "shared by the processes the task runs"
    ),
    "MARQUARDT_CACHE_DIR": (
        "the folder every package of marquardt caches in: per-machine measurements (the "
        "step-time planner's constants) and, under compiled/, the solver's compiled kernels; "
        "default: marquardt/ in the platform's cache folder ($XDG_CACHE_HOME or ~/.cache on "
        "Linux, ~/Library/Caches on macOS, %LOCALAPPDATA% on Windows)"
    ),
    "XDG_CACHE_HOME": (
        "the user's cache folder (freedesktop; Linux and other Unix systems), under which "
        "marquardt/ is used"
    ),
    "LOCALAPPDATA": "the user's local application-data folder (Windows), under which "
    "marquardt/ is used",
}


def _get(name: str) -> str | None:
    # A single accessor keeps the list above honest: tests assert every name read is listed.
    if name not in ENVIRONMENT:
        raise KeyError(f"{name} is not a documented setting of marquardt.devices")
    return os.environ.get(name)


def cuda_visible_devices() -> str | None:
    """``CUDA_VISIBLE_DEVICES`` as set, or ``None`` when unset (every GPU visible)."""
    return _get("CUDA_VISIBLE_DEVICES")


def cuda_device_order() -> str:
    """``CUDA_DEVICE_ORDER``, upper-cased; ``FASTEST_FIRST`` when unset, as CUDA assumes."""
    return (_get("CUDA_DEVICE_ORDER") or "FASTEST_FIRST").strip().upper()


def _windows_cache() -> str:
    home = os.path.expanduser("~")
    return _get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")


def _macos_cache() -> str:
    return os.path.join(os.path.expanduser("~"), "Library", "Caches")


def _freedesktop_cache() -> str:
    return _get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


#: ``sys.platform`` -> the user's cache folder there; any other platform: freedesktop's.
_PLATFORM_CACHE: dict[str, Callable[[], str]] = {
    "win32": _windows_cache,
    "darwin": _macos_cache,
}


def cache_folder() -> str:
    """The folder every package of marquardt caches in (never created here).

    ``MARQUARDT_CACHE_DIR`` where it is set, else ``marquardt`` in the platform's cache
    folder: ``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux (and other Unix systems),
    ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows. The step-time planner's
    measurements are kept in it; ``marquardt.solver`` keeps its compiled kernels in its
    ``compiled`` folder.

    Returns:
        The folder's path, with ``~`` expanded.
    """
    own = (_get("MARQUARDT_CACHE_DIR") or "").strip()
    if own:
        return os.path.expanduser(own)
    base = _PLATFORM_CACHE.get(sys.platform, _freedesktop_cache)()
    return os.path.join(base, "marquardt")


def legate_config() -> str:
    """``LEGATE_CONFIG``, or ``""`` when unset."""
    return _get("LEGATE_CONFIG") or ""


def legate_auto_config() -> bool:
    """Whether Legate's automatic configuration is on (``LEGATE_AUTO_CONFIG`` is not 0)."""
    value = (_get("LEGATE_AUTO_CONFIG") or "1").strip().lower()
    return value not in {"0", "false", "no", "off"}


def _int_or_none(*names: str) -> int | None:
    for name in names:
        value = _get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


@dataclass(frozen=True)
class ProcessPlace:
    """Where this process sits in a launched job (``None`` where the launcher said nothing)."""

    rank: int | None
    local_rank: int | None
    world_size: int | None
    slurm_job_gpus: str | None


def process_place() -> ProcessPlace:
    """Rank, local rank and world size from torchrun's variables, else from Slurm's."""
    return ProcessPlace(
        rank=_int_or_none("RANK", "SLURM_PROCID"),
        local_rank=_int_or_none("LOCAL_RANK", "SLURM_LOCALID"),
        world_size=_int_or_none("WORLD_SIZE", "SLURM_NTASKS"),
        slurm_job_gpus=_get("SLURM_JOB_GPUS"),
    )


def describe_visible() -> str:
    """``CUDA_VISIBLE_DEVICES=...`` as it reads in messages (``unset`` when absent)."""
    value = cuda_visible_devices()
    return "CUDA_VISIBLE_DEVICES unset" if value is None else f"CUDA_VISIBLE_DEVICES={value}"


#: The variables the thread rule reads (``marquardt.devices.threads_per_process``).
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "LOCAL_WORLD_SIZE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_CPUS_PER_TASK",
    "LEGATE_CONFIG",
)


def thread_settings() -> dict[str, str]:
    """The thread rule's variables that are set, by name (read now, never cached)."""
    values = {
        "OMP_NUM_THREADS": _get("OMP_NUM_THREADS"),
        "MKL_NUM_THREADS": _get("MKL_NUM_THREADS"),
        "OPENBLAS_NUM_THREADS": _get("OPENBLAS_NUM_THREADS"),
        "LOCAL_WORLD_SIZE": _get("LOCAL_WORLD_SIZE"),
        "SLURM_NTASKS_PER_NODE": _get("SLURM_NTASKS_PER_NODE"),
        "SLURM_TASKS_PER_NODE": _get("SLURM_TASKS_PER_NODE"),
        "SLURM_NODEID": _get("SLURM_NODEID"),
        "SLURM_CPUS_PER_TASK": _get("SLURM_CPUS_PER_TASK"),
        "LEGATE_CONFIG": _get("LEGATE_CONFIG"),
    }
    return {name: value for name, value in values.items() if value is not None}
