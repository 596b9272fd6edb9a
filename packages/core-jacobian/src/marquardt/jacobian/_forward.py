"""Forward-only slices: residuals ``r`` and the loss without any Jacobian.

The loss is ``rᵀr / R`` by default (the mean of squared residuals the LM step minimises),
or a ``loss_fn`` that returns the mean over the samples it is given, weighted by each
slice's number of samples. Slices run on every model device at once, with no autograd
graph, so one sample costs at most the sum of its layer outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._errors import message
from ._modes._common import rows_of
from ._modes._forward_laplacian import taylor_residuals
from ._points import AnyResidual, PointResidual
from ._replicas import Replicas
from ._slicing import DeviceWorkers, slice_ranges, to_device, to_host_fresh
from ._validate import check_finite_residuals

__all__ = ["ForwardSlice", "LossFn", "batch_loss", "forward_samples", "forward_slices"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: Per slice: (residuals if kept, loss sum or loss_fn value as a 0-dim tensor on the
#: slice's device, rows, samples).
ForwardSlice = tuple[torch.Tensor | None, torch.Tensor, int, int]


def forward_slices(
    replicas: Replicas,
    residual_fn: AnyResidual,
    workers: DeviceWorkers,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    batch: int,
    size: int,
    loss_fn: LossFn | None,
    keep_residuals: bool,
    output_device: torch.device,
    check_residuals: bool = True,
) -> list[ForwardSlice]:
    """Per slice of ``size`` samples: (residuals if kept, loss sum or loss_fn value, rows,
    samples). Residuals kept are fresh tensors on ``output_device``. The values stay on
    their devices (no host synchronisation per slice). ``check_residuals`` raises on a
    non-finite residual; without it a non-finite residual makes the value non-finite."""

    if loss_fn is not None and isinstance(residual_fn, PointResidual):
        raise TypeError(
            message(
                "a loss_fn(outputs, targets) for a PointResidual was requested",
                "its residuals are not functions of the outputs",
                "leave loss_fn unset: the loss is the mean of the squared residuals",
            )
        )

    def job(dev: int, lo: int, hi: int) -> ForwardSlice:
        replica = replicas[dev]
        x = to_device(inputs[lo:hi], replica.device)
        y = to_device(targets[lo:hi], replica.device)
        with torch.no_grad():
            if isinstance(residual_fn, PointResidual):
                out, res = None, taylor_residuals(replica, residual_fn, x, y)
            else:
                out = replica.module(x)
                res = rows_of(residual_fn(out, y), hi - lo)
            if check_residuals:
                check_finite_residuals(res, res.shape[1], lo)
            value = res.pow(2).sum() if loss_fn is None or out is None else loss_fn(out, y)
        kept = to_host_fresh(res.reshape(-1), output_device) if keep_residuals else None
        return kept, value.detach().reshape(()), int(res.numel()), hi - lo

    jobs = [(lambda dev, lo=lo, hi=hi: job(dev, lo, hi)) for lo, hi in slice_ranges(batch, size)]
    return workers.run_all(jobs)


def batch_loss(parts: list[ForwardSlice], home: torch.device, *, custom: bool) -> torch.Tensor:
    """The batch loss as a 0-dim float64 tensor on ``home``: ``Σ rᵢ² / R``, or with a
    custom loss (the mean over a slice's samples) the mean weighted by samples."""
    if custom:
        total = sum(p[1].to(home, torch.float64) * p[3] for p in parts)
        count = sum(p[3] for p in parts)
    else:
        total = sum(p[1].to(home, torch.float64) for p in parts)
        count = sum(p[2] for p in parts)
    assert isinstance(total, torch.Tensor)
    return total / count


def forward_samples(budget: int, activations: int, dtype: torch.dtype) -> int:
    """Samples per forward-only slice within ``budget`` bytes (no graph: one sample costs at
    most the sum of its layer outputs, ``activations`` numbers)."""
    item = torch.empty((), dtype=dtype).element_size()
    return max(1, budget // (item * activations))
