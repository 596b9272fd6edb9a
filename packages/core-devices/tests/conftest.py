"""A fake NVML, injected where the package meets ``pynvml``, and a clean environment."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from marquardt.devices import _nvml, _settings

GiB = 1 << 30

# NVML return codes, as in nvml.h.
CODES = {
    "NotSupported": 3,
    "NoPermission": 4,
    "NotFound": 6,
    "DriverNotLoaded": 9,
    "LibraryNotFound": 12,
    "GpuIsLost": 15,
    "Unknown": 999,
}


class NVMLError(Exception):
    """Like pynvml's: the code in ``value``; each code has its own subclass."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        names = {code: name for name, code in CODES.items()}
        return names.get(self.value, f"code {self.value}")


ERRORS: dict[str, type[NVMLError]] = {
    name: type(f"NVMLError_{name}", (NVMLError,), {}) for name in CODES
}


def nvml_error(name: str) -> NVMLError:
    return ERRORS[name](CODES[name])


@dataclass
class FakeMig:
    uuid: str
    total: int = 10 * GiB
    used: int = 0


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    total: int = 40 * GiB
    used: int = 0
    util: tuple[int, int] | None = (0, 0)
    mig: bool | None = False  # None: the GPU has no MIG support
    migs: list[FakeMig | None] = field(default_factory=list)  # None: an empty MIG slot
    pci: str = "00000000:07:00.0"
    procs: list[tuple[int, int]] = field(default_factory=list)
    fail: dict[str, str] = field(default_factory=dict)  # NVML call -> error name


class FakeNvml:
    """The subset of pynvml that marquardt.devices calls, over a list of ``FakeGpu``."""

    NVML_ERROR_LIBRARY_NOT_FOUND = CODES["LibraryNotFound"]
    NVML_ERROR_DRIVER_NOT_LOADED = CODES["DriverNotLoaded"]
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: str | None = None) -> None:
        self.gpus = gpus or []
        self.init_error = init_error
        self.calls: list[str] = []
        self.open = 0
        for name, cls in ERRORS.items():
            setattr(self, f"NVMLError_{name}", cls)

    def _check(self, call: str, device: Any) -> None:
        self.calls.append(call)
        if self.open <= 0:
            raise nvml_error("Unknown")  # NVML was not initialised
        error = getattr(device, "fail", {}).get(call)
        if error:
            raise nvml_error(error)

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error:
            raise nvml_error(self.init_error)
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount", None)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex", None)
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu | FakeMig) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu | FakeMig) -> bytes:
        self._check("nvmlDeviceGetName", handle)
        # Older pynvml returns bytes: the package must decode.
        name = handle.name if isinstance(handle, FakeGpu) else "NVIDIA A100 MIG 2g.10gb"
        return name.encode()

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu | FakeMig) -> SimpleNamespace:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(
            total=handle.total, used=handle.used, free=handle.total - handle.used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        if handle.util is None:
            raise nvml_error("NotSupported")
        return SimpleNamespace(gpu=handle.util[0], memory=handle.util[1])

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        self._check("nvmlDeviceGetMigMode", handle)
        if not isinstance(handle, FakeGpu) or handle.mig is None:
            raise nvml_error("NotSupported")
        return [int(handle.mig), int(handle.mig)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle)
        return len(handle.migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, slot: int) -> FakeMig:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        mig = handle.migs[slot]
        if mig is None:
            raise nvml_error("NotFound")
        return mig

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> SimpleNamespace:
        self._check("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=handle.pci)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu | FakeMig) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        procs = handle.procs if isinstance(handle, FakeGpu) else []
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in procs]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check("nvmlSystemGetProcessName", None)
        if pid == 4242:
            raise nvml_error("NoPermission")
        return f"python{pid}"


def uuid(n: int) -> str:
    return f"GPU-{n:08x}-aaaa-bbbb-cccc-{n:012x}"


def four_gpus() -> list[FakeGpu]:
    return [FakeGpu(uuid(i), pci=f"00000000:{7 + i:02X}:00.0") for i in range(4)]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with none of the variables the package reads."""
    for name in _settings.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_nvml() -> Iterator[Callable[..., FakeNvml]]:
    """``fake_nvml(gpus, init_error=None)`` installs a fake NVML for the test."""
    previous = _nvml.use_module(None)

    def install(gpus: list[FakeGpu] | None = None, init_error: str | None = None) -> FakeNvml:
        fake = FakeNvml(gpus, init_error)
        _nvml.use_module(fake)
        return fake

    yield install
    _nvml.use_module(previous)


@pytest.fixture
def fake_legate(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, int], None]:
    """``fake_legate(gpus, nodes)`` makes ``legate.core`` look imported and started."""

    def install(gpus: int, nodes: int = 1) -> None:
        target = SimpleNamespace(GPU="gpu", CPU="cpu")
        machine = SimpleNamespace(count=lambda kind: gpus * nodes if kind == "gpu" else 1)
        core = SimpleNamespace(
            TaskTarget=target,
            get_machine=lambda: machine,
            get_legate_runtime=lambda: SimpleNamespace(node_count=nodes),
        )
        monkeypatch.setitem(__import__("sys").modules, "legate.core", core)

    return install


@pytest.fixture
def kit() -> SimpleNamespace:
    """The fake's building blocks, for tests (conftest is not importable by name)."""
    return SimpleNamespace(
        FakeGpu=FakeGpu,
        FakeMig=FakeMig,
        uuid=uuid,
        four_gpus=four_gpus,
        nvml_error=nvml_error,
        GiB=GiB,
    )
