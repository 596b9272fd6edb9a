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
from ._whole import is_whole

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Split:
    """Visible CUDA ordinals divided between Legate (``legate``) and the model (``model``).

    Arguments:
        visible: the visible devices, in ordinal order.
        share: Legate's share; it holds the first ``share.gpus`` ordinals (at most all).
    """

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
    """The split of the visible GPUs between Legate and the model for this process now.

    Arguments:
        gpus: the visible devices; default: those NVML reports, as
            [`discover_gpus`][marquardt.devices.discover_gpus] does.

    Returns:
        The visible devices with Legate's share of them.

    Raises:
        LegateConfigError: ``LEGATE_CONFIG`` asks for more GPUs than are visible (Legate
            would fail at start-up), or cannot be read.
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
    """The torch devices left for the model once Legate has taken its GPUs.

    Legate holds the first K visible ordinals (K from
    [`legate_gpu_count`][marquardt.devices.legate_gpu_count]). No CUDA context is created:
    devices are counted through NVML.

    Arguments:
        cpu_fallback: with no GPU left, return ``[torch.device("cpu")]`` (warning where
            Legate holds every visible GPU), so the same script runs on a CPU machine;
            false: raise instead.
        count: exactly this many model GPUs (the first ones left); ``None``: all left.

    Returns:
        ``cuda:K`` … ``cuda:n-1`` (the first ``count`` of them), or ``[cpu]``.

    Raises:
        DeviceError: ``count`` is not a whole number >= 1, or more than are left; or none
            is left and ``cpu_fallback`` is false.
        LegateConfigError: ``LEGATE_CONFIG`` asks for more GPUs than are visible.
    """
    if count is not None and not is_whole(count, 1):
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
    """Check, before any work, that no model device is held by Legate or missing.

    CPU devices always pass. Nothing is changed.

    Arguments:
        devices: ``torch.device`` objects, strings such as ``"cuda:1"`` or ints (ordinals).
        split: the split to check against; default:
            [`current_split`][marquardt.devices.current_split]'s.

    Raises:
        DeviceError: a CUDA device is held by Legate or is not visible.
        TypeError: a device is a ``bool`` (not an ordinal).
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
