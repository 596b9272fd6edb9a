"""Against the real NVML and driver: runs only on a machine with an NVIDIA GPU."""

from __future__ import annotations

import pytest

from marquardt.devices import discover_gpus
from marquardt.devices._discovery import survey


def _gpu_present() -> bool:
    try:
        return bool(survey().gpus)
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_present(), reason="needs an NVIDIA GPU visible through NVML")
def test_real_gpus_match_torch() -> None:
    torch = pytest.importorskip("torch", reason="needs torch to compare device counts")
    gpus = discover_gpus()
    assert all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)
    assert all(
        g.memory_total > 0 and g.memory_used + g.memory_free <= g.memory_total * 1.01 for g in gpus
    )
    assert not torch.cuda.is_initialized()
    # torch.cuda.device_count() also counts through NVML first, without a CUDA context.
    assert len(gpus) == torch.cuda.device_count()
    for gpu in gpus:
        assert torch.cuda.get_device_properties(gpu.ordinal).total_memory <= gpu.memory_total
