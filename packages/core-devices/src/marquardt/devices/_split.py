"""The split of the visible GPUs: the first K to Legate (the solver), the rest to the model.

PyTorch is imported when a ``torch.device`` is built, not at import of this package.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _settings
from ._discovery import GpuInfo, survey
from ._errors import DeviceError, LegateConfigError
from ._legate import LegateShare, legate_share

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Split:
    """Visible CUDA ordinals divided between Legate (``legate``) and the model (``model``)."""

    visible: tuple[GpuInfo, ...]
    share: LegateShare

    @property
    def legate(self) -> tuple[int, ...]:
        return tuple(range(min(self.share.gpus, len(self.visible))))

    @property
    def model(self) -> tuple[int, ...]:
        return tuple(range(len(self.legate), len(self.visible)))

    def describe(self) -> str:
        """``after Legate took 3 (CUDA_VISIBLE_DEVICES=0,1,2,3)``, for messages."""
        return f"after Legate took {len(self.legate)} ({_settings.describe_visible()})"


def current_split(gpus: Sequence[GpuInfo] | None = None) -> Split:
    """The split for this process now; ``gpus`` defaults to [`discover_gpus`][marquardt.devices.discover_gpus]' answer.

    Raises [`LegateConfigError`][marquardt.devices.LegateConfigError] when ``LEGATE_CONFIG`` asks for more GPUs than are
    visible (Legate would fail at start-up).
    """
    visible = tuple(survey().gpus if gpus is None else gpus)
    share = legate_share()
    if share.source == "LEGATE_CONFIG" and share.gpus > len(visible):
        raise LegateConfigError(
            f"LEGATE_CONFIG={_settings.legate_config()!r} asks Legate for {share.gpus} GPUs "
            f"but only {len(visible)} are visible ({_settings.describe_visible()}). "
            f"HINT: run legate --gpus {max(len(visible) - 1, 0)} so the model keeps one"
        )
    return Split(visible, share)


def _torch() -> Any:
    import torch

    return torch


def get_available_gpus(
    *, cpu_fallback: bool = True, count: int | None = None
) -> list[torch.device]:
    """The ``torch.device``\\ s left for the model once Legate has taken its GPUs.

    Legate holds the first K visible ordinals (K from [`legate_gpu_count`][marquardt.devices.legate_gpu_count]); this returns
    ``cuda:K`` … ``cuda:n-1``. With none left it returns ``[torch.device("cpu")]``, so the
    same script runs on a CPU machine, unless ``cpu_fallback`` is false, when it raises.
    ``count`` asks for exactly that many model GPUs (the first ones left) and raises if fewer
    are left. No CUDA context is created: devices are counted through NVML.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise DeviceError(
            f"count={count!r} model GPUs were asked for; a count must be a whole number >= 1. "
            "HINT: omit count to take every GPU left"
        )
    split = current_split()
    torch = _torch()
    left = list(split.model)
    if count is not None and count > len(left):
        hint = f"run legate --gpus {len(split.visible) - count}"
        if count == len(split.visible):
            hint = (
                f"ask for at most {count - 1} so Legate keeps one GPU, or run legate "
                "--gpus 0 (the solver then runs on CPUs)"
            )
        elif count > len(split.visible):
            hint = f"ask for at most {len(split.visible)} GPUs, the number visible"
        raise DeviceError(
            f"requested {count} model GPUs but only {len(left)} "
            f"{'is' if len(left) == 1 else 'are'} left {split.describe()}. HINT: {hint}"
        )
    if not left:
        if not cpu_fallback:
            reason = split.describe() if split.visible else "no GPU is visible"
            raise DeviceError(
                f"requested model GPUs with cpu_fallback=False but none is left ({reason}). "
                "HINT: run legate with fewer --gpus, expose more GPUs through "
                "CUDA_VISIBLE_DEVICES, or allow the CPU fallback"
            )
        if split.visible:
            warnings.warn(
                f"Legate holds every visible GPU ({split.describe()}); the model runs on the "
                f"CPU. HINT: run legate --gpus {len(split.visible) - 1}",
                RuntimeWarning,
                stacklevel=2,
            )
        return [torch.device("cpu")]
    chosen = left if count is None else left[:count]
    return [torch.device("cuda", ordinal) for ordinal in chosen]


def check_model_devices(devices: Sequence[Any], *, split: Split | None = None) -> None:
    """Raise [`DeviceError`][marquardt.devices.DeviceError] if a model device is held by Legate or is not visible.

    ``devices`` are ``torch.device``\\ s, strings such as ``"cuda:1"`` or ints (ordinals).
    CPU devices always pass. Nothing is changed; the check runs before any work.
    """
    split = current_split() if split is None else split
    owned = set(split.legate)
    for device in devices:
        kind, ordinal = _kind_and_index(device)
        if kind != "cuda":
            continue
        label = f"cuda:{ordinal}"
        if ordinal >= len(split.visible):
            raise DeviceError(
                f"model device {label} was given but only {len(split.visible)} GPU(s) are "
                f"visible ({_settings.describe_visible()}). HINT: use get_available_gpus()"
            )
        if ordinal in owned:
            left = ", ".join(f"cuda:{i}" for i in split.model) or "none (use cpu)"
            raise DeviceError(
                f"model device {label} is held by Legate (it holds cuda:0..cuda:"
                f"{len(owned) - 1}, {split.describe()}). HINT: use the GPUs left: {left}"
            )


def _kind_and_index(device: Any) -> tuple[str, int]:
    if isinstance(device, bool):
        raise TypeError(f"a device must be a torch.device, str or int, not {device!r}")
    if isinstance(device, int):
        return "cuda", device
    text = str(device)
    kind, _, index = text.partition(":")
    if kind == "cuda":
        # A bare "cuda" means the current device, which is ordinal 0 until someone changes it.
        return kind, int(index) if index else 0
    return kind, -1
