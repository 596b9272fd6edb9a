"""The compute processes on each GPU (NVML), with who runs them and whether they are orphans.

NVML lists the processes that hold a CUDA context on a GPU and, under MPS, the clients of
the MPS server; ``/proc`` (see ``_proc``) adds the owner, the parent, the command line,
and whether the parent that started a process is gone. GPUs are numbered by NVML's index
(PCI bus order, as ``nvidia-smi`` numbers them), not by this process's CUDA ordinals: the
list is about the machine, whatever ``CUDA_VISIBLE_DEVICES`` hides here. On a GPU split by
MIG, processes are listed per instance.

NVML reports PIDs as the driver sees them; inside a container an older driver reports the
host's. A PID that ``/proc`` here does not know is listed with what NVML says, never
matched to another process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _nvml
from ._discovery import _mig_handles, _nvml_failure, _optional, _text
from ._proc import PROC, ProcessStat, is_orphan, read_process, user_name

# Newest first: bindings newer than the driver name functions the library lacks.
_COMPUTE = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
_MPS = (
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses",
)
# NVML_VALUE_NOT_AVAILABLE (unsigned -1): older bindings pass it on instead of None.
_NOT_AVAILABLE = (1 << 64) - 1
_NOT_SUPPORTED = 3


@dataclass(frozen=True)
class ComputeProcess:
    """One process computing on one GPU (or MIG instance).

    ``gpu_index`` and ``gpu_uuid`` name the physical GPU (NVML's index, as ``nvidia-smi``);
    ``instance_uuid`` the MIG instance, if the GPU is split. ``kind`` is ``"C"`` (a CUDA
    context), ``"M"`` (an MPS client) or ``"C+M"``. ``used_memory`` is in bytes, ``None`` where
    NVML does not say. ``process`` is ``/proc``'s view, ``None`` when no such PID can be
    read here; ``orphan`` as ``_proc.is_orphan`` decides, ``None`` when it cannot tell.
    """

    gpu_index: int
    gpu_uuid: str
    instance_uuid: str | None
    pid: int
    kind: str
    used_memory: int | None
    nvml_name: str | None
    process: ProcessStat | None
    orphan: bool | None

    @property
    def user(self) -> str | None:
        """The login name of its owner, ``None`` when the process cannot be read here."""
        return None if self.process is None else user_name(self.process.uid)

    @property
    def command(self) -> str:
        """Its command line from ``/proc``, else the name NVML gives, else ``?``."""
        if self.process is not None:
            return self.process.command
        return self.nvml_name or "?"

    @property
    def place(self) -> str:
        """``GPU 0`` or ``GPU 1 (MIG-…)``, for messages."""
        return f"GPU {self.gpu_index}" + (f" ({self.instance_uuid})" if self.instance_uuid else "")


@dataclass(frozen=True)
class GpuProcesses:
    """One physical GPU and its compute processes; ``note`` says why the list may be short."""

    index: int
    uuid: str
    name: str
    processes: tuple[ComputeProcess, ...]
    note: str = ""


@dataclass(frozen=True)
class ProcessSurvey:
    """Every GPU NVML sees, with its compute processes."""

    gpus: tuple[GpuProcesses, ...]
    notes: tuple[str, ...] = ()
    nvml_available: bool = True

    @property
    def processes(self) -> tuple[ComputeProcess, ...]:
        return tuple(p for gpu in self.gpus for p in gpu.processes)

    def find(self, pid: int) -> tuple[ComputeProcess, ...]:
        """Where ``pid`` computes: one entry per GPU or instance (none if NVML does not list it)."""
        return tuple(p for p in self.processes if p.pid == pid)


class _NoListing(Exception):
    """The NVML library has none of the functions that list a GPU's processes."""


def _running(nvml: Any, names: tuple[str, ...], handle: Any) -> list[Any]:
    """The processes from the newest of ``names`` that both the bindings and NVML have."""
    for name in names:
        call = getattr(nvml, name, None)
        if call is None:
            continue
        try:
            return list(call(handle))
        except Exception as exc:
            if not _nvml.is_missing_function(nvml, exc):
                raise
    raise _NoListing(names[-1])


def _unsupported(nvml: Any, exc: BaseException) -> bool:
    value = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED)
    return _nvml.is_nvml_error(nvml, exc) and getattr(exc, "value", None) == value


def _memory(value: Any) -> int | None:
    return None if value is None or int(value) == _NOT_AVAILABLE else int(value)


def _on_handle(nvml: Any, handle: Any) -> dict[int, tuple[str, int | None]]:
    """``pid -> (kind, used memory)`` of one GPU or MIG instance."""
    found: dict[int, tuple[str, int | None]] = {}
    compute = _running(nvml, _COMPUTE, handle)
    try:
        mps = _running(nvml, _MPS, handle)
    except _NoListing:  # bindings or driver without MPS queries: no MPS clients to list
        mps = []
    except Exception as exc:
        if not _unsupported(nvml, exc):
            raise
        mps = []
    for kind, entries in (("C", compute), ("M", mps)):
        for entry in entries:
            pid = int(entry.pid)
            memory = _memory(getattr(entry, "usedGpuMemory", None))
            if pid in found:
                seen, seen_memory = found[pid]
                found[pid] = (f"{seen}+{kind}", seen_memory if memory is None else memory)
            else:
                found[pid] = (kind, memory)
    return found


def _describe(
    nvml: Any, index: int, uuid: str, instance: str | None, pid: int, kind: str,
    memory: int | None, proc: Path,
) -> ComputeProcess:  # fmt: skip
    name = _optional(nvml, nvml.nvmlSystemGetProcessName, pid)
    process = read_process(pid, proc)
    parent = None if process is None else read_process(process.ppid, proc)
    return ComputeProcess(
        gpu_index=index,
        gpu_uuid=uuid,
        instance_uuid=instance,
        pid=pid,
        kind=kind,
        used_memory=memory,
        nvml_name=None if name is None else _text(name),
        process=process,
        orphan=None if process is None else is_orphan(process, parent),
    )


def _gpu(nvml: Any, index: int, proc: Path) -> GpuProcesses:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    name = _text(nvml.nvmlDeviceGetName(handle))
    mode = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    handles: list[tuple[Any, str | None]]
    if mode is not None and mode[0]:
        # A split GPU answers per instance; the whole GPU's answer needs root.
        handles = [(mig, _text(nvml.nvmlDeviceGetUUID(mig))) for mig in _mig_handles(nvml, handle)]
    else:
        handles = [(handle, None)]
    processes: list[ComputeProcess] = []
    try:
        for device, instance in handles:
            for pid, (kind, memory) in sorted(_on_handle(nvml, device).items()):
                processes.append(_describe(nvml, index, uuid, instance, pid, kind, memory, proc))
    except _NoListing:
        note = (
            "this NVML library lists no processes (no nvmlDeviceGetComputeRunningProcesses "
            "function the bindings know). HINT: install the nvidia-ml-py release of your "
            "driver's version (`nvidia-smi` prints it), e.g. pip install 'nvidia-ml-py==535.*'"
        )
        return GpuProcesses(index, uuid, name, (), note)
    except Exception as exc:
        if not _nvml.is_nvml_error(nvml, exc):
            raise
        note = (
            f"NVML does not list its processes ({type(exc).__name__}: {exc}). HINT: compare "
            "with `nvidia-smi --query-compute-apps=pid,used_memory --format=csv`"
        )
        return GpuProcesses(index, uuid, name, (), note)
    return GpuProcesses(index, uuid, name, tuple(processes))


def gpu_processes(proc: Path = PROC) -> ProcessSurvey:
    """Every GPU NVML sees and the compute processes on it, read from NVML and ``proc``.

    Without NVML (no bindings, library or driver) the survey is empty and its note says
    why. Raises ``NvmlError`` when NVML is present but fails to list
    the GPUs; a GPU whose processes cannot be listed gets a note instead.
    """
    try:
        with _nvml.session() as nvml:
            try:
                count = int(nvml.nvmlDeviceGetCount())
                gpus = tuple(_gpu(nvml, index, proc) for index in range(count))
            except Exception as exc:
                if not _nvml.is_nvml_error(nvml, exc):
                    raise
                raise _nvml_failure(exc) from exc
    except _nvml.NvmlUnavailable as exc:
        return ProcessSurvey((), (f"no NVIDIA GPU can be used: {exc}",), nvml_available=False)
    notes = () if gpus else ("NVML reports no GPU on this machine",)
    return ProcessSurvey(gpus, notes)
