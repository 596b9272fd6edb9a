"""A batch for ``LMA.step``, checked before any work: `check_batch`.

The residual vector r(θ) of one step stacks ``residual_fn(model(x_i), y_i)`` over the
samples of the batch (dim 0), so inputs and targets must pair up sample by sample, be
finite (one NaN makes every entry of JᵀJ and Jᵀr NaN), sit where the model can read them
and match the parameters' dtype. A bad batch raises `SolverInputError` and leaves the
parameters, λ, the step count and the report as they were.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from marquardt.devices._whole import require_whole

from .._errors import BatchNotFiniteError, SolverInputError, message

__all__ = ["FiniteScans", "check_batch", "same_device"]


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are the same (``cuda`` without an index is ``cuda:0``)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


class FiniteScans:
    """The last tensors found finite, so that a batch passed again, unchanged, is not
    scanned again (a full-batch fit passes the same data every step).

    A tensor is known by a weak reference (the same object, still alive: its memory was
    not reused) and its version counter (unchanged: nothing wrote into it in place).
    """

    def __init__(self) -> None:
        self._known: list[tuple[weakref.ref[torch.Tensor], int]] = []

    def known(self, value: torch.Tensor) -> bool:
        return any(ref() is value and value._version == v for ref, v in self._known)

    def remember(self, *values: torch.Tensor) -> None:
        self._known = [(weakref.ref(t), t._version) for t in values]


def _all_finite(values: list[torch.Tensor]) -> bool:
    """Whether every value is finite, read from the device once where they share one (each
    read of a GPU tensor's value waits for the device)."""
    if not values:
        return True
    flags = [torch.isfinite(value).all() for value in values]
    if all(flag.device == flags[0].device for flag in flags):
        return bool(torch.stack(flags).all())
    return all(bool(flag) for flag in flags)


def _check_shapes(inputs: object, targets: object) -> int:
    """Tensors with matching, non-empty batch dimensions; returns the batch's size."""
    for name, value in (("inputs", inputs), ("targets", targets)):
        if not isinstance(value, torch.Tensor):
            raise SolverInputError(
                message(
                    f"LMA.step expects {name} as a torch.Tensor",
                    f"got {type(value).__name__}",
                    "convert with torch.as_tensor(...)",
                )
            )
    assert isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor)
    if inputs.dim() == 0 or targets.dim() == 0:
        raise SolverInputError(
            message(
                "LMA.step expects batched inputs and targets (samples along dim 0)",
                f"got shapes {tuple(inputs.shape)} and {tuple(targets.shape)}",
                "add a batch dimension, e.g. x.unsqueeze(0)",
            )
        )
    batch = int(inputs.shape[0])
    if batch == 0:
        raise SolverInputError(
            message(
                "LMA.step expects a batch of at least one sample",
                "the batch is empty",
                "skip empty batches",
            )
        )
    if int(targets.shape[0]) != batch:
        raise SolverInputError(
            message(
                "LMA.step expects as many targets as inputs along dim 0",
                f"got {batch} inputs and {int(targets.shape[0])} targets",
                "pass matching (x, y) pairs, e.g. from one DataLoader batch",
            )
        )
    return batch


def _check_placement(
    inputs: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype, home: Sequence[torch.device]
) -> None:
    """Floating tensors in the parameters' dtype, on the host or a model device."""
    for name, value in (("inputs", inputs), ("targets", targets)):
        if value.is_floating_point() and value.dtype != dtype:
            raise SolverInputError(
                message(
                    f"LMA.step expects floating {name} in the parameters' dtype {dtype}",
                    f"{name} are {value.dtype}",
                    f"convert them with {name}.to({dtype}) (or the model with "
                    f"model.to({value.dtype}) before building the LMA)",
                )
            )
        if value.device.type != "cpu" and not any(same_device(value.device, d) for d in home):
            raise SolverInputError(
                message(
                    f"LMA.step expects {name} on the host or on a model device "
                    f"({', '.join(map(str, home))})",
                    f"{name} are on {value.device}",
                    f"move them with {name}.to({str(home[0])!r}) or keep them on the CPU",
                )
            )


def _check_finite(inputs: torch.Tensor, targets: torch.Tensor, scans: FiniteScans | None) -> None:
    """No NaN/inf, scanning only what ``scans`` has not seen finite and unchanged."""
    unscanned = [
        (name, value)
        for name, value in (("inputs", inputs), ("targets", targets))
        if (value.is_floating_point() or value.is_complex())
        and not (scans is not None and scans.known(value))
    ]
    if _all_finite([value for _, value in unscanned]):
        unscanned = []
    for name, value in unscanned:  # something is not finite: name what
        if not bool(torch.isfinite(value).all()):
            raise BatchNotFiniteError(
                message(
                    f"LMA.step expects finite {name}",
                    f"{name} contain {int((~torch.isfinite(value)).sum())} NaN/inf values",
                    "clean the data; nothing was changed",
                )
            )
    if scans is not None:
        scans.remember(inputs, targets)


def _check_slice(slice_size: object, batch: int) -> int | None:
    """``slice_size``: None, or an integer in [1, batch]."""
    if slice_size is None:
        return None
    slice_size = require_whole(
        slice_size,
        1,
        SolverInputError,
        "LMA.step expects slice_size to be None or an integer ≥ 1",
        "pass e.g. slice_size=batch_size // num_devices",
    )
    if slice_size > batch:
        raise SolverInputError(
            message(
                f"LMA.step was given slice_size={slice_size} for a batch of {batch} samples",
                "a slice cannot hold more samples than the batch",
                "pass slice_size=min(slice_size, len(x)) or None (one slice per device), "
                "or drop the last, shorter batch (DataLoader(drop_last=True))",
            )
        )
    return int(slice_size)


def check_batch(
    inputs: object,
    targets: object,
    slice_size: object,
    *,
    dtype: torch.dtype,
    home: Sequence[torch.device],
    scans: FiniteScans | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """``(inputs, targets, slice_size)`` checked for a model of ``dtype`` on ``home``.

    With ``scans``, tensors it saw finite and unchanged are not scanned for NaN/inf again.
    """
    batch = _check_shapes(inputs, targets)
    assert isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor)
    _check_placement(inputs, targets, dtype, home)
    _check_finite(inputs, targets, scans)
    return inputs, targets, _check_slice(slice_size, batch)
