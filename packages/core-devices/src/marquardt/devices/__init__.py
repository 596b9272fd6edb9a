"""Which GPUs this process has, which Legate holds, which are left for the model; and how
many threads each process on this node may run.

Discovery goes through NVML only, so importing this package or calling its functions never
creates a CUDA context (forked workers stay safe); Legate is never imported here, PyTorch
only by the functions that set its threads (`choose_threads`, `apply_threads`).
"""

from __future__ import annotations

from ._discovery import GpuInfo, GpuProcess, discover_gpus
from ._errors import DeviceError, LegateConfigError, NvmlError, UntrustedCacheWarning
from ._legate import LegateShare, legate_gpu_count, legate_share
from ._machine import DEFAULT_CONSTANTS, MachineConstants, load_constants, store_constants
from ._memory import HostMemory, device_memory, host_memory
from ._plan_subsets import subset_size
from ._plan_types import Plan
from ._planner import plan
from ._settings import cache_folder
from ._split import Split, check_model_devices, current_split, get_available_gpus
from ._step_time import StepTime, prefers_matrix_free, step_seconds
from ._threads import CpuBudget, ThreadChoice, cpu_budget, threads_per_process
from ._threads_apply import applied_threads, apply_threads, choose_threads

__all__ = [
    "DEFAULT_CONSTANTS",
    "CpuBudget",
    "DeviceError",
    "GpuInfo",
    "GpuProcess",
    "HostMemory",
    "LegateConfigError",
    "LegateShare",
    "MachineConstants",
    "NvmlError",
    "Plan",
    "Split",
    "StepTime",
    "ThreadChoice",
    "UntrustedCacheWarning",
    "applied_threads",
    "apply_threads",
    "cache_folder",
    "check_model_devices",
    "choose_threads",
    "cpu_budget",
    "current_split",
    "device_memory",
    "discover_gpus",
    "get_available_gpus",
    "host_memory",
    "legate_gpu_count",
    "legate_share",
    "load_constants",
    "plan",
    "prefers_matrix_free",
    "step_seconds",
    "store_constants",
    "subset_size",
    "threads_per_process",
]
