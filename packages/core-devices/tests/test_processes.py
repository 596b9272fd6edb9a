"""GPU processes through a fake NVML that reports real processes started by the tests."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from marquardt.devices import NvmlError
from marquardt.devices._proc import user_name
from marquardt.devices._processes import gpu_processes
from marquardt.testing.processes import unused_pid


def test_processes_per_gpu_with_owner_command_and_orphans(
    fake_nvml: Any, kit: Any, real_processes: Any
) -> None:
    child = real_processes.sleeper()
    orphan, _ = real_processes.orphan()
    elsewhere = unused_pid()  # NVML lists it; no such PID here (another PID namespace)
    gpus = kit.four_gpus()[:3]
    gpus[0].procs = [(orphan, 2 * kit.GiB), (child.pid, kit.GiB)]
    gpus[2].procs = [(elsewhere, 512 << 20)]
    fake_nvml(gpus)
    found = gpu_processes()
    assert found.nvml_available and found.notes == ()
    assert [(g.index, g.uuid, len(g.processes)) for g in found.gpus] == [
        (0, kit.uuid(0), 2),
        (1, kit.uuid(1), 0),
        (2, kit.uuid(2), 1),
    ]
    first, second = found.gpus[0].processes  # sorted by PID
    by_pid = {p.pid: p for p in (first, second)}
    mine, lost = by_pid[child.pid], by_pid[orphan]
    assert mine.used_memory == kit.GiB and mine.kind == "C" and mine.place == "GPU 0"
    assert mine.user == user_name(os.getuid()) and mine.orphan is False
    assert mine.process is not None and mine.process.ppid == os.getpid()
    assert str(real_processes.device) in mine.command
    assert lost.orphan is True and lost.used_memory == 2 * kit.GiB
    (far,) = found.gpus[2].processes
    assert far.process is None and far.orphan is None and far.user is None
    assert far.command == f"python{elsewhere}"  # NVML's name for it
    assert found.find(child.pid) == (mine,) and found.find(12345678) == ()


def test_mig_instances_list_their_own_processes(fake_nvml: Any, kit: Any) -> None:
    gpu = kit.FakeGpu(kit.uuid(0), mig=True)
    gpu.migs = [kit.FakeMig("MIG-1111", procs=[(101, kit.GiB)]), None, kit.FakeMig("MIG-2222")]
    gpu.procs = [(999, kit.GiB)]  # the whole GPU's answer is not asked for
    fake_nvml([gpu])
    (entry,) = gpu_processes().gpus
    assert [(p.pid, p.instance_uuid, p.place) for p in entry.processes] == [
        (101, "MIG-1111", "GPU 0 (MIG-1111)")
    ]


def test_newest_listing_the_driver_has(fake_nvml: Any, kit: Any) -> None:
    gpu = kit.FakeGpu(kit.uuid(0), procs=[(7, kit.GiB)])
    fake = fake_nvml([gpu])
    tried: list[str] = []

    def missing(name: str) -> Any:
        def call(handle: Any) -> list[Any]:
            tried.append(name)
            raise kit.nvml_error("FunctionNotFound")  # bindings newer than the driver

        return call

    def version_2(handle: Any) -> list[Any]:
        tried.append("v2")
        return [SimpleNamespace(pid=7, usedGpuMemory=(1 << 64) - 1)]  # "not available"

    fake.nvmlDeviceGetComputeRunningProcesses_v3 = missing("v3")
    fake.nvmlDeviceGetComputeRunningProcesses_v2 = version_2
    (entry,) = gpu_processes().gpus
    assert tried == ["v3", "v2"]
    assert [(p.pid, p.used_memory) for p in entry.processes] == [(7, None)]


def test_unversioned_mismatch_falls_back(fake_nvml: Any, kit: Any) -> None:
    # pynvml's unversioned wrappers raise NVMLLibraryMismatchError, not an NVMLError.
    gpu = kit.FakeGpu(kit.uuid(0))
    fake = fake_nvml([gpu])

    def mismatch(handle: Any) -> list[Any]:
        raise kit.NVMLLibraryMismatchError("use a versioned function")

    fake.nvmlDeviceGetComputeRunningProcesses_v3 = mismatch
    fake.nvmlDeviceGetComputeRunningProcesses_v2 = mismatch
    fake.nvmlDeviceGetComputeRunningProcesses = mismatch
    (entry,) = gpu_processes().gpus
    assert entry.processes == ()
    assert "lists no processes" in entry.note and "HINT: install the nvidia-ml-py" in entry.note


def test_mps_clients_are_listed(fake_nvml: Any, kit: Any) -> None:
    gpu = kit.FakeGpu(kit.uuid(0), procs=[(10, kit.GiB)])
    fake = fake_nvml([gpu])
    fake.nvmlDeviceGetMPSComputeRunningProcesses = lambda handle: [
        SimpleNamespace(pid=10, usedGpuMemory=None),
        SimpleNamespace(pid=11, usedGpuMemory=kit.GiB),
    ]
    (entry,) = gpu_processes().gpus
    assert [(p.pid, p.kind, p.used_memory) for p in entry.processes] == [
        (10, "C+M", kit.GiB),
        (11, "M", kit.GiB),
    ]


def test_a_gpu_that_cannot_list_gets_a_note(fake_nvml: Any, kit: Any) -> None:
    gpus = kit.four_gpus()[:2]
    gpus[0].fail["nvmlDeviceGetComputeRunningProcesses"] = "NoPermission"
    gpus[1].procs = [(5, kit.GiB)]
    fake_nvml(gpus)
    first, second = gpu_processes().gpus
    assert first.processes == () and "NoPermission" in first.note and "HINT:" in first.note
    assert [p.pid for p in second.processes] == [5] and second.note == ""


def test_without_nvml(fake_nvml: Any) -> None:
    fake_nvml([], init_error="LibraryNotFound")
    found = gpu_processes()
    assert not found.nvml_available and found.gpus == ()
    assert "libnvidia-ml.so.1) is not found" in found.notes[0]


def test_nvml_failing_while_listing(fake_nvml: Any, kit: Any) -> None:
    gpus = kit.four_gpus()[:1]
    gpus[0].fail["nvmlDeviceGetUUID"] = "GpuIsLost"
    fake = fake_nvml(gpus)
    with pytest.raises(NvmlError, match=r"GpuIsLost.*HINT: "):
        gpu_processes()
    assert fake.open == 0
