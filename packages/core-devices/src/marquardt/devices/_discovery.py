"""GPU discovery through NVML: what each CUDA ordinal is, and how loaded it is.

Only NVML is asked (see ``_nvml``), so discovery never creates a CUDA context and a process
that calls it can still fork workers safely. The CUDA ordinals are those PyTorch will see
in this process: NVML's GPUs filtered and reordered by ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from . import _nvml, _settings
from ._errors import NvmlError
from ._visible import PhysicalGpu, parse_visible, resolve_visible


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU, as NVML reports it.

    Arguments:
        pid: the process id.
        name: the process name, ``None`` where NVML may not tell it.
        used_memory: the GPU memory the process uses, in bytes (``None`` where unknown).
    """

    pid: int
    name: str | None
    used_memory: int | None


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device as PyTorch will number it (``cuda:<ordinal>``), seen through NVML.

    Memory is in bytes; utilisation in percent, ``None`` where NVML does not report it (as
    for MIG instances).

    Arguments:
        ordinal: the CUDA ordinal in this process (``cuda:<ordinal>``).
        index: NVML's index of the physical GPU (PCI order).
        uuid: the device's UUID; a MIG instance has its own (``MIG-…``).
        name: the device's name as NVML gives it.
        memory_total: total memory (of the slice, for a MIG instance).
        memory_used: memory in use.
        memory_free: memory free.
        utilization_gpu: GPU utilisation, or ``None``.
        utilization_memory: memory-controller utilisation, or ``None``.
        mig_mode: whether MIG is enabled on the physical GPU; ``None`` on GPUs without
            MIG support.
        pci_bus_id: the physical GPU's PCI bus id.
        processes: the compute processes running on the device.
        parent_uuid: for a MIG instance, the UUID of its whole GPU; ``None`` otherwise.
    """

    ordinal: int
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    memory_free: int
    utilization_gpu: int | None
    utilization_memory: int | None
    mig_mode: bool | None
    pci_bus_id: str
    processes: tuple[GpuProcess, ...] = ()
    parent_uuid: str | None = None

    @property
    def is_mig(self) -> bool:
        """Whether this CUDA device is a MIG instance rather than a whole GPU."""
        return self.parent_uuid is not None

    @property
    def busy(self) -> bool:
        """Whether another process already computes on this device."""
        return bool(self.processes)


@dataclass(frozen=True)
class Survey:
    """The visible GPUs, and in plain words why there are none or why the list is short."""

    gpus: tuple[GpuInfo, ...]
    notes: tuple[str, ...] = ()
    nvml_available: bool = True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(nvml: Any, call: Any, *args: Any) -> Any:
    """``call(*args)``, or ``None`` when NVML says the query is unsupported for this device."""
    try:
        return call(*args)
    except Exception as exc:
        if _nvml.is_nvml_error(nvml, exc):
            return None
        raise


def _mig_handles(nvml: Any, handle: Any) -> list[Any]:
    count = _optional(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    found = []
    for slot in range(int(count)):
        # Empty slots raise NVMLError_NotFound: the configured instances need not be packed.
        mig = _optional(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is not None:
            found.append(mig)
    return found


def _processes(nvml: Any, handle: Any) -> tuple[GpuProcess, ...]:
    running = _optional(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    result = []
    for proc in running:
        name = _optional(nvml, nvml.nvmlSystemGetProcessName, proc.pid)
        used = getattr(proc, "usedGpuMemory", None)
        result.append(GpuProcess(int(proc.pid), None if name is None else _text(name), used))
    return tuple(result)


def _describe(nvml: Any, handle: Any, ordinal: int, index: int, parent: Any) -> GpuInfo:
    """Read one device (a whole GPU, or a MIG instance whose whole GPU is ``parent``)."""
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    util = (
        None if parent is not None else _optional(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    )
    owner = handle if parent is None else parent
    mig = _optional(nvml, nvml.nvmlDeviceGetMigMode, owner)
    pci = nvml.nvmlDeviceGetPciInfo(owner)
    return GpuInfo(
        ordinal=ordinal,
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_total=int(memory.total),
        memory_used=int(memory.used),
        memory_free=int(memory.free),
        utilization_gpu=None if util is None else int(util.gpu),
        utilization_memory=None if util is None else int(util.memory),
        mig_mode=None if mig is None else bool(mig[0]),
        pci_bus_id=_text(pci.busId),
        processes=_processes(nvml, handle),
        parent_uuid=None if parent is None else _text(nvml.nvmlDeviceGetUUID(parent)),
    )


def survey() -> Survey:
    """Discover the visible GPUs and explain an empty or shortened list.

    Raises ``NvmlError`` when NVML is present but fails.
    """
    try:
        with _nvml.session() as nvml:
            return _survey(nvml)
    except _nvml.NvmlUnavailable as exc:
        return Survey((), (f"no NVIDIA GPU can be used: {exc}",), nvml_available=False)


def _survey(nvml: Any) -> Survey:
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        physical = []
        migs: dict[str, Any] = {}
        for index, handle in enumerate(handles):
            mode = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
            enabled = bool(mode is not None and mode[0])
            mig_uuids = []
            for mig in _mig_handles(nvml, handle) if enabled else []:
                uuid = _text(nvml.nvmlDeviceGetUUID(mig))
                migs[uuid] = mig
                mig_uuids.append(uuid)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            physical.append(PhysicalGpu(index, uuid, enabled, tuple(mig_uuids)))
        spec = parse_visible(_settings.cuda_visible_devices())
        resolution = resolve_visible(spec, physical)
        gpus = tuple(
            _describe(
                nvml,
                handles[d.gpu_index] if d.mig_uuid is None else migs[d.mig_uuid],
                d.ordinal,
                d.gpu_index,
                None if d.mig_uuid is None else handles[d.gpu_index],
            )
            for d in resolution.devices
        )
    except Exception as exc:
        if not _nvml.is_nvml_error(nvml, exc):
            raise
        raise _nvml_failure(exc) from exc
    notes = _notes(count, gpus, resolution.note)
    return Survey(gpus, notes)


def _nvml_failure(exc: BaseException) -> Exception:
    return NvmlError(
        f"NVML started but failed while listing the GPUs ({type(exc).__name__}: {exc}). "
        "HINT: run `nvidia-smi -q` to see which GPU is in trouble; a GPU marked lost or "
        "needing reset must be reset (nvidia-smi -r) or hidden with CUDA_VISIBLE_DEVICES"
    )


def _notes(count: int, gpus: tuple[GpuInfo, ...], visible_note: str) -> tuple[str, ...]:
    notes = []
    if count == 0:
        notes.append("NVML reports no GPU on this machine")
    elif not gpus:
        notes.append(f"{count} GPU(s) present but none visible ({_settings.describe_visible()})")
    if visible_note:
        notes.append(f"{_settings.describe_visible()}: {visible_note}")
    # MIG instances carry their profile in the name; only whole GPUs tell the model apart.
    names = {gpu.name for gpu in gpus if not gpu.is_mig}
    if len(names) > 1 and _settings.cuda_device_order() != "PCI_BUS_ID":
        notes.append(
            "GPUs of different models with CUDA_DEVICE_ORDER unset: CUDA numbers the fastest "
            "first, NVML by PCI bus. HINT: export CUDA_DEVICE_ORDER=PCI_BUS_ID"
        )
    return tuple(notes)


def discover_gpus() -> list[GpuInfo]:
    """The GPUs this process may use, as ``cuda:0``, ``cuda:1``, … in PyTorch's numbering.

    Only NVML is called: no CUDA context is created. A note that carries a hint (such as
    GPUs of different models with ``CUDA_DEVICE_ORDER`` unset) is given as a
    ``RuntimeWarning``.

    Returns:
        One [`GpuInfo`][marquardt.devices.GpuInfo] per visible device, in ordinal order;
        ``[]`` on a machine without NVML, driver or GPU.

    Raises:
        NvmlError: NVML is present but fails, rather than pretending the machine has no GPU.
    """
    result = survey()
    for note in result.notes:
        if "HINT:" in note:
            warnings.warn(note, RuntimeWarning, stacklevel=2)
    return list(result.gpus)
