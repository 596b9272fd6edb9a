"""Where a run computes: CPU or GPU, and the backend, from the configuration and the GPUs present.

GPUs are counted through NVML (``marquardt.devices``), so no CUDA context is created before
a spawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marquardt.devices import get_available_gpus

from ._config import TrainConfig
from ._errors import LaunchError


def visible_gpu_count() -> int:
    """GPUs this process may use, counted through NVML (no CUDA context is created)."""
    try:
        return sum(1 for d in get_available_gpus(cpu_fallback=True) if d.type == "cuda")
    except Exception:
        # NVML missing or broken: a machine whose GPUs cannot be counted trains on the CPU.
        return 0


@dataclass(frozen=True)
class Compute:
    """The resolved ``compute_setup`` / ``backend``, and notices for the user."""

    use_gpu: bool
    backend: str
    notices: tuple[str, ...] = field(default=())

    @property
    def device_type(self) -> str:
        return "cuda" if self.use_gpu else "cpu"


def resolve_compute(config: TrainConfig, gpu_count: int) -> Compute:
    """Decide CPU or GPU, and the backend, from the configuration and the GPUs present.

    ``gpu`` without GPUs is an error; ``auto`` without GPUs trains on the CPU, and then a
    requested ``nccl`` (GPU-only) is replaced by ``gloo`` with a notice, so the seeds'
    defaults (``backend="nccl"``, ``compute_setup="auto"``) run on a laptop.
    """
    setup, backend = config.compute_setup, config.backend
    if setup == "gpu" and gpu_count == 0:
        raise LaunchError(
            "TrainConfig(compute_setup='gpu') but no GPU is visible to this process (NVML finds "
            "none, or CUDA_VISIBLE_DEVICES hides them all). HINT: use compute_setup='auto' or "
            "'cpu' (with backend='gloo') to train on CPUs, or run on a node with GPUs"
        )
    use_gpu = setup == "gpu" or (setup == "auto" and gpu_count > 0)
    notices: list[str] = []
    if not use_gpu:
        if backend == "nccl":
            notices.append(
                "no GPU found: compute_setup='auto' trains on the CPU, and the GPU-only backend "
                "'nccl' is replaced by 'gloo' (pass --backend gloo to silence this notice)"
            )
            backend = "gloo"
        elif backend == "auto":
            backend = "gloo"
    elif backend == "auto":
        backend = "nccl"
    return Compute(use_gpu=use_gpu, backend=backend, notices=tuple(notices))
