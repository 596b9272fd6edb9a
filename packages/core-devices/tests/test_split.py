"""The split: Legate's first K ordinals, the rest to the model, and the errors around it."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from marquardt.devices import (
    DeviceError,
    LegateConfigError,
    check_model_devices,
    current_split,
    get_available_gpus,
)


def cuda(*ordinals: int) -> list[torch.device]:
    return [torch.device("cuda", i) for i in ordinals]


def test_no_gpu_falls_back_to_cpu(fake_nvml: Any) -> None:
    fake_nvml([], init_error="LibraryNotFound")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no GPU at all is not worth a warning
        assert get_available_gpus() == [torch.device("cpu")]


def test_no_gpu_without_fallback_raises(fake_nvml: Any) -> None:
    fake_nvml([])
    with pytest.raises(DeviceError, match=r"cpu_fallback=False .*no GPU is visible.*HINT: "):
        get_available_gpus(cpu_fallback=False)


def test_all_gpus_to_the_model_without_legate(four_gpus_nvml: Any) -> None:
    assert get_available_gpus() == cuda(0, 1, 2, 3)


def test_legate_takes_the_first_k(four_gpus_nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 3")
    assert get_available_gpus() == cuda(3)
    split = current_split()
    assert split.legate == (0, 1, 2) and split.model == (3,)


def test_ordinals_follow_visible_devices(
    four_gpus_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,1")
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 1")
    # Ordinals are CUDA's after CUDA_VISIBLE_DEVICES, not NVML's indices.
    assert get_available_gpus() == cuda(1, 2)


def test_running_legate_share(four_gpus_nvml: Any, fake_legate: Any) -> None:
    fake_legate(2, 1)
    assert get_available_gpus() == cuda(2, 3)


def test_requesting_more_than_left_names_the_fix(
    four_gpus_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 3")
    with pytest.raises(DeviceError) as info:
        get_available_gpus(count=2)
    assert str(info.value) == (
        "requested 2 model GPUs but only 1 is left after Legate took 3 "
        "(CUDA_VISIBLE_DEVICES=0,1,2,3). HINT: run legate --gpus 2"
    )
    with pytest.raises(DeviceError, match=r"requested 4 model GPUs .*HINT: ask for at most 3"):
        get_available_gpus(count=4)
    with pytest.raises(DeviceError, match=r"requested 6 .*HINT: ask for at most 4 GPUs"):
        get_available_gpus(count=6)


def test_count_takes_the_first_left(four_gpus_nvml: Any) -> None:
    assert get_available_gpus(count=2) == cuda(0, 1)


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
def test_bad_count_fails_before_discovery(fake_nvml: Any, count: Any) -> None:
    fake = fake_nvml([])
    with pytest.raises(DeviceError, match="whole number >= 1"):
        get_available_gpus(count=count)
    assert fake.calls == []  # NVML was not even opened


def test_legate_holding_everything_warns_and_falls_back(
    fake_nvml: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml(kit.four_gpus()[:2])
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 2")
    with pytest.warns(RuntimeWarning, match=r"Legate holds every visible GPU.*legate --gpus 1"):
        assert get_available_gpus() == [torch.device("cpu")]
    with pytest.raises(DeviceError, match=r"after Legate took 2"):
        get_available_gpus(cpu_fallback=False)


def test_config_asking_more_than_visible(
    four_gpus_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 3")
    with pytest.raises(
        LegateConfigError, match=r"asks Legate for 3 GPUs but only 2 are visible.*--gpus 1"
    ):
        get_available_gpus()


def test_device_held_by_legate_is_refused(
    four_gpus_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 3")
    check_model_devices([torch.device("cuda:3"), "cpu", torch.device("cpu")])
    with pytest.raises(DeviceError, match=r"cuda:1 is held by Legate.*HINT: .*cuda:3"):
        check_model_devices([torch.device("cuda", 3), "cuda:1"])
    with pytest.raises(DeviceError, match=r"cuda:0 is held by Legate"):
        check_model_devices(["cuda"])
    with pytest.raises(DeviceError, match=r"cuda:7 was given but only 4 GPU"):
        check_model_devices([7])
    with pytest.raises(TypeError):
        check_model_devices([True])
