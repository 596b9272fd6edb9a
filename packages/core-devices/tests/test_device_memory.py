"""device_memory: the driver's free memory plus the blocks torch's allocator holds unused."""

from __future__ import annotations

import pytest
import torch

from marquardt.devices import device_memory, host_memory

GIB = 1 << 30


def _cuda(monkeypatch: pytest.MonkeyPatch, free: int, reserved: int, allocated: int) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)


def test_cached_blocks_count_as_available(monkeypatch: pytest.MonkeyPatch) -> None:
    # An earlier step freed 60 GiB of tensors: the driver sees 8 GiB free, torch can hand
    # out 68 GiB.
    _cuda(monkeypatch, free=8 * GIB, reserved=64 * GIB, allocated=4 * GIB)
    found = device_memory(torch.device("cuda", 0))
    assert found.available == 68 * GIB
    assert found.source == "free memory of cuda:0 + 60.00 GiB cached by torch"


def test_no_cache_is_the_driver_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, free=8 * GIB, reserved=0, allocated=0)
    found = device_memory(torch.device("cuda", 0))
    assert (found.available, found.source) == (8 * GIB, "free memory of cuda:0")


def test_the_cpu_is_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_memory(torch.device("cpu")).source == host_memory().source
