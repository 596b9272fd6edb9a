"""Checks run before any work: each raises with what was asked, found and a HINT."""

from __future__ import annotations

import torch
from torch import nn

from marquardt.devices._kind import wrong_kind

from . import _settings
from ._errors import (
    BatchLengthError,
    BatchNormTrainingError,
    EmptyBatchError,
    NonFiniteInputError,
    ResidualNotFiniteError,
    SliceSizeError,
    message,
)
from ._modes._table import check_mode
from ._points import AnyResidual, PointResidual
from ._replicas import Replicas

__all__ = [
    "check_batch",
    "check_batchnorm",
    "check_engine",
    "check_finite_residuals",
    "check_residual_fn",
    "check_slice_size",
]


def _length(t: object, what: str) -> int:
    if not isinstance(t, torch.Tensor):
        raise wrong_kind(
            TypeError,
            f"{what} were expected as a torch.Tensor whose first dimension is the batch",
            t,
            f"convert them with torch.as_tensor({what})",
        )
    if t.dim() == 0:
        raise BatchLengthError(
            message(
                f"{what} were expected with a batch dimension",
                "got a 0-dimensional tensor",
                f"add the batch dimension, e.g. {what}.reshape(-1, 1)",
            )
        )
    return int(t.shape[0])


def check_batch(inputs: torch.Tensor, targets: torch.Tensor, *, scan: bool = True) -> int:
    """The batch size, after checking lengths agree, are positive and values are finite.

    ``scan=False`` leaves out the scan for NaN/inf, for a caller that made it already.
    """
    n_in = _length(inputs, "inputs")
    n_tg = _length(targets, "targets")
    if n_in != n_tg:
        raise BatchLengthError(
            message(
                "inputs and targets were expected to hold the same number of samples",
                f"inputs hold {n_in} and targets hold {n_tg}",
                "pass matching slices of your data set (x[i:j], y[i:j])",
            )
        )
    if n_in == 0:
        raise EmptyBatchError(
            message(
                "a batch of samples was expected",
                "the batch is empty (0 samples)",
                "skip empty batches (e.g. DataLoader(drop_last=True))",
            )
        )
    for t, what in ((inputs, "inputs"), (targets, "targets")):
        if scan and (t.is_floating_point() or t.is_complex()):
            finite = torch.isfinite(t)
            if not bool(finite.all()):
                bad = int((~finite).sum())
                first = int((~finite).reshape(n_in, -1).any(dim=1).nonzero()[0, 0])
                raise NonFiniteInputError(
                    message(
                        f"finite {what} were expected",
                        f"{bad} values are NaN or infinite (first in sample {first})",
                        f"clean or drop those samples before the step (torch.isfinite({what}))",
                    )
                )
    return n_in


def check_slice_size(slice_size: int | None, batch: int, num_devices: int) -> int:
    """``slice_size`` resolved: default ``ceil(batch / num_devices)``, else ``1..batch``."""
    if slice_size is None:
        return max(1, -(-batch // max(1, num_devices)))
    if isinstance(slice_size, bool) or not isinstance(slice_size, int):
        raise SliceSizeError(
            message(
                "slice_size was expected as a positive int",
                f"got {slice_size!r} ({type(slice_size).__name__})",
                "pass an int such as batch // number of devices, or None for that default",
            )
        )
    if slice_size <= 0 or slice_size > batch:
        raise SliceSizeError(
            message(
                f"slice_size={slice_size} was requested for a batch of {batch}",
                f"it must be between 1 and {batch}",
                f"use at most batch // devices = {max(1, batch // max(1, num_devices))}, "
                "or None for that default",
            )
        )
    return slice_size


def check_batchnorm(model: nn.Module) -> None:
    """Refuse batch-norm layers in training mode.

    In training mode batch norm normalises each sample with statistics of the whole
    batch (and updates running statistics on every forward), so residual ``i`` depends
    on every sample and the objective changes between the Jacobian and the trial
    steps: neither the per-sample Jacobian nor LM's accept/reject test is then
    defined. We refuse rather than silently switch to evaluation semantics, so the
    model behaves in training exactly as it will in evaluation.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            raise BatchNormTrainingError(
                message(
                    "per-sample residuals and Jacobian rows were requested",
                    f"layer {name!r} ({type(module).__name__}) is in training mode, which "
                    "normalises with batch statistics and couples the samples",
                    "call model.eval() before building the engine (running statistics are "
                    "then used), or replace batch norm by GroupNorm/LayerNorm",
                )
            )


def check_finite_residuals(
    residuals: torch.Tensor, outputs_per_sample: int, first_sample: int = 0
) -> None:
    """Raise when a residual is NaN or infinite, naming the first sample concerned.

    ``first_sample`` is the batch index of the first sample ``residuals`` belong to.
    """
    finite = torch.isfinite(residuals)
    if not bool(finite.all()):
        first_row = int((~finite).reshape(-1).nonzero()[0, 0])
        raise ResidualNotFiniteError(
            message(
                "finite residuals were expected from residual_fn(model(x), y)",
                f"{int((~finite).sum())} are NaN or infinite (first at sample "
                f"{first_sample + first_row // max(1, outputs_per_sample)})",
                "check the model output and residual_fn (e.g. sqrt of a negative, log(0)); "
                "add an eps inside sqrt/log",
            )
        )


def check_residual_fn(residual_fn: object, error: type[Exception], asked: str) -> None:
    """Refuse ``residual_fn`` unless it is a function ``(outputs, targets) -> residuals`` or a
    `PointResidual`.

    Arguments:
        residual_fn: what was given.
        error: the exception class to raise.
        asked: what the caller asked for, in its own words.

    Raises:
        Exception: ``error``, in the house form, when ``residual_fn`` is neither.
    """
    if not callable(residual_fn) and not isinstance(residual_fn, PointResidual):
        raise wrong_kind(error, asked, residual_fn, "pass e.g. lambda a, b: a - b")


def check_engine(
    replicas: object, residual_fn: AnyResidual, mode: str, memory_budget: int | None
) -> str:
    """``JacobianEngine``'s arguments, checked; returns the mode it runs in (``mode``, or
    the one ``MARQUARDT_JACOBIAN_MODE`` forces over "auto")."""
    if not isinstance(replicas, Replicas):
        raise wrong_kind(
            TypeError,
            "JacobianEngine expects a Replicas object",
            replicas,
            "wrap the model first: Replicas(model, devices)",
        )
    check_residual_fn(
        residual_fn,
        TypeError,
        "residual_fn was expected as a function (output, target) -> residuals or a PointResidual",
    )
    if isinstance(residual_fn, PointResidual):
        residual_fn.check_model(replicas.dtype)
    forced = _settings.mode() if mode == "auto" else None
    source = f"{_settings.ENV_MODE}={forced}" if forced else None
    chosen = check_mode(forced or mode, source)
    if memory_budget is not None and memory_budget <= 0:
        raise ValueError(
            message(
                f"memory_budget={memory_budget} bytes was requested",
                "it is not positive",
                "pass a positive number of bytes, or None for the default",
            )
        )
    return chosen
