"""A fake NVML, injected where the package meets ``pynvml``, and a clean environment."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
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
    "FunctionNotFound": 13,
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


class NVMLLibraryMismatchError(Exception):
    """Like pynvml's: an unversioned wrapper found no function in the library (not an NVMLError)."""


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
    procs: list[tuple[int, int]] = field(default_factory=list)


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
    procs: list[tuple[int, int]] = field(default_factory=list)  # (pid, used GPU memory)
    fail: dict[str, str] = field(default_factory=dict)  # NVML call -> error name


class FakeNvml:
    """The subset of pynvml that marquardt.devices calls, over a list of ``FakeGpu``."""

    NVML_ERROR_LIBRARY_NOT_FOUND = CODES["LibraryNotFound"]
    NVML_ERROR_DRIVER_NOT_LOADED = CODES["DriverNotLoaded"]
    NVML_ERROR_FUNCTION_NOT_FOUND = CODES["FunctionNotFound"]
    NVML_ERROR_NOT_SUPPORTED = CODES["NotSupported"]
    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError

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
        # The unversioned name, as old bindings have it; tests add the versioned ones.
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in handle.procs]

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
def four_gpus_nvml(fake_nvml: Callable[..., FakeNvml]) -> FakeNvml:
    """A fake NVML of four idle 40 GiB GPUs (``four_gpus``), installed for the test."""
    return fake_nvml(four_gpus())


@pytest.fixture
def on_gpu(fake_nvml: Callable[..., FakeNvml]) -> Callable[..., FakeNvml]:
    """``on_gpu(*pids)`` installs a fake NVML that lists ``pids`` as compute processes of
    GPU 0."""

    def install(*pids: int) -> FakeNvml:
        return fake_nvml([FakeGpu(uuid(0), procs=[(pid, GiB) for pid in pids])])

    return install


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
        NVMLLibraryMismatchError=NVMLLibraryMismatchError,
        gone=gone,
        GiB=GiB,
    )


# Real processes for the clean-up tests. Each holds open a file named like the device files
# a CUDA process holds (/dev/nvidia0), in a temporary folder whose prefix the tests give as
# ``device_files``; each says "ready" once its signal handling is set, so no signal is sent
# before the process is what the test says it is.
SLEEPER = """
import signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
device = open(sys.argv[2], "rb")
print("ready", flush=True)
time.sleep(300)
"""

# A launcher whose child, like a login shell, leads a session of its own and starts a run,
# then exits: the run is adopted by PID 1 or by the nearest subreaper. With "leader" the run
# calls setsid itself (detached on purpose, as a service is). With "reaper" the launcher
# first makes itself a subreaper (prctl PR_SET_CHILD_SUBREAPER), so it adopts the run, and
# prints the signal that ends it.
ORPHAN = """
import ctypes, os, sys, time
device_path, mode = sys.argv[1], sys.argv[2]
if mode == "reaper":
    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
read_end, write_end = os.pipe()
shell = os.fork()
if shell == 0:
    os.setsid()
    if os.fork() == 0:
        if mode == "leader":
            os.setsid()
        device = open(device_path, "rb")
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.write(write_end, b"%d" % os.getpid())
        os.close(write_end)
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.close(write_end)
run = int(os.read(read_end, 64))
os.waitpid(shell, 0)
print(run, flush=True)  # the run holds its device file, and its shell has gone
if mode == "reaper":
    pid, status = os.wait()
    print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status), flush=True)
"""


class RealProcesses:
    """Starts the processes of the clean-up tests and ends whatever is left of them."""

    def __init__(self, folder: Path) -> None:
        self.device = folder / "nvidia0"
        self.device.write_bytes(b"")
        self.device_files = str(folder / "nvidia")
        self.children: list[subprocess.Popen[str]] = []
        self.pidfds: list[int] = []

    def _start(self, argv: list[str], **options: Any) -> subprocess.Popen[str]:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, **options)
        self.children.append(child)
        return child

    def sleeper(self, on_term: str = "exit") -> subprocess.Popen[str]:
        """A child that ends on SIGTERM (``exit``) or ignores it (``ignore``)."""
        child = self._start([sys.executable, "-c", SLEEPER, on_term, str(self.device)])
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        return child

    def other_users(self) -> subprocess.Popen[str]:
        """A child of user nobody (65534): only root may start one."""
        return self._start(["sleep", "300"], user=65534)

    def orphan(self, mode: str = "orphan") -> tuple[int, subprocess.Popen[str]]:
        """A run whose parent exited: its PID, and the launcher (its reaper in ``reaper`` mode)."""
        launcher = self._start([sys.executable, "-c", ORPHAN, str(self.device), mode])
        assert launcher.stdout is not None
        pid = int(launcher.stdout.readline())
        self.pidfds.append(os.pidfd_open(pid))
        if mode != "reaper":
            assert launcher.wait(timeout=60) == 0
        return pid, launcher

    def close(self) -> None:
        for fd in self.pidfds:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=60)
            if child.stdout is not None:
                child.stdout.close()


@pytest.fixture
def real_processes(tmp_path: Path) -> Iterator[RealProcesses]:
    """Real processes (sleepers, orphans) that the test may stop; the rest is killed after."""
    if not Path("/proc/self/stat").exists() or not hasattr(os, "pidfd_open"):
        pytest.skip("the clean-up commands read /proc and use pidfds: Linux 5.3 or later")
    found = RealProcesses(tmp_path)
    yield found
    found.close()


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (no such process, or a zombie waiting to be collected)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"
