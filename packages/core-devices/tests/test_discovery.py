"""Discovery through a fake NVML: several GPUs, MIG, busy GPUs, NVML failures."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from marquardt.devices import NvmlError, discover_gpus
from marquardt.devices._discovery import survey


def test_four_gpus_in_order(four_gpus_nvml: Any, kit: Any) -> None:
    fake = four_gpus_nvml
    gpus = discover_gpus()
    assert [g.ordinal for g in gpus] == [0, 1, 2, 3]
    assert [g.uuid for g in gpus] == [kit.uuid(i) for i in range(4)]
    first = gpus[0]
    assert first.name == "NVIDIA A100-SXM4-40GB"  # bytes decoded
    assert first.memory_total == 40 * kit.GiB and first.memory_free == 40 * kit.GiB
    assert first.pci_bus_id == "00000000:07:00.0"
    assert first.mig_mode is False and not first.is_mig and not first.busy
    # NVML is opened and closed once.
    assert fake.calls.count("nvmlInit") == 1 and fake.calls.count("nvmlShutdown") == 1
    assert fake.open == 0


def test_visible_devices_reorder_and_renumber(
    four_gpus_nvml: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    gpus = discover_gpus()
    assert [(g.ordinal, g.index, g.uuid) for g in gpus] == [
        (0, 3, kit.uuid(3)),
        (1, 1, kit.uuid(1)),
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", kit.uuid(2)[:12])  # "GPU-00000002", a unique prefix
    assert [g.index for g in discover_gpus()] == [2]


def test_busy_gpu_lists_its_processes(fake_nvml: Any, kit: Any) -> None:
    gpus = kit.four_gpus()
    gpus[1].used, gpus[1].util = 30 * kit.GiB, (97, 60)
    gpus[1].procs = [(1234, 29 * kit.GiB), (4242, kit.GiB)]  # 4242: name not readable
    fake_nvml(gpus)
    busy = discover_gpus()[1]
    assert busy.busy and busy.utilization_gpu == 97 and busy.utilization_memory == 60
    assert busy.memory_free == 10 * kit.GiB
    assert [(p.pid, p.name, p.used_memory) for p in busy.processes] == [
        (1234, "python1234", 29 * kit.GiB),
        (4242, None, kit.GiB),
    ]


def test_mig_instances_are_cuda_devices(fake_nvml: Any, kit: Any) -> None:
    gpus = kit.four_gpus()[:2]
    gpus[1].mig = True
    gpus[1].migs = [kit.FakeMig("MIG-1111", used=kit.GiB), None, kit.FakeMig("MIG-2222")]
    fake_nvml(gpus)
    found = discover_gpus()
    assert [g.uuid for g in found] == [kit.uuid(0), "MIG-1111", "MIG-2222"]
    mig = found[1]
    assert mig.is_mig and mig.parent_uuid == kit.uuid(1) and mig.index == 1
    assert mig.memory_total == 10 * kit.GiB and mig.memory_used == kit.GiB
    assert mig.utilization_gpu is None  # NVML does not report it per instance
    assert mig.mig_mode is True and mig.pci_bus_id == gpus[1].pci


def test_unsupported_queries_become_none(fake_nvml: Any, kit: Any) -> None:
    gpu = kit.FakeGpu(kit.uuid(0), name="Tesla T4", util=None, mig=None)
    gpu.fail["nvmlDeviceGetComputeRunningProcesses"] = "NotSupported"
    fake_nvml([gpu])
    (info,) = discover_gpus()
    assert info.utilization_gpu is None and info.mig_mode is None and info.processes == ()


@pytest.mark.parametrize("error", ["LibraryNotFound", "DriverNotLoaded"])
def test_no_driver_means_no_gpu(fake_nvml: Any, error: str) -> None:
    fake_nvml([], init_error=error)
    assert discover_gpus() == []
    result = survey()
    assert not result.nvml_available
    assert "no NVIDIA GPU can be used" in result.notes[0]


def test_no_gpu_present(fake_nvml: Any) -> None:
    fake_nvml([])
    assert discover_gpus() == []
    assert survey().notes == ("NVML reports no GPU on this machine",)


def test_all_hidden_is_explained(four_gpus_nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    result = survey()
    assert result.gpus == ()
    assert "4 GPU(s) present but none visible (CUDA_VISIBLE_DEVICES=-1)" in result.notes


def test_nvml_present_but_failing_at_init(fake_nvml: Any) -> None:
    fake_nvml([], init_error="NoPermission")
    with pytest.raises(NvmlError, match=r"nvmlInit\(\) failed .*NoPermission.*HINT: "):
        discover_gpus()


def test_nvml_failing_on_a_lost_gpu(fake_nvml: Any, kit: Any) -> None:
    gpus = kit.four_gpus()
    gpus[2].fail["nvmlDeviceGetMemoryInfo"] = "GpuIsLost"
    fake = fake_nvml(gpus)
    with pytest.raises(NvmlError, match=r"GpuIsLost.*HINT: .*CUDA_VISIBLE_DEVICES"):
        discover_gpus()
    assert fake.open == 0  # NVML was shut down despite the failure


def test_mixed_models_warn_about_device_order(
    fake_nvml: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = kit.four_gpus()[:2]
    gpus[1].name = "NVIDIA GeForce RTX 4090"
    fake_nvml(gpus)
    with pytest.warns(RuntimeWarning, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        discover_gpus()
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert not any("CUDA_DEVICE_ORDER" in n for n in survey().notes)


def test_missing_bindings_mean_no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes any import of the name raise ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    result = survey()
    assert result.gpus == () and not result.nvml_available
    assert "pip install nvidia-ml-py" in result.notes[0]
