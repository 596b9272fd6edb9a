"""One optimizer step on one batch: ``optimize_step(model, optimizer, loss_fn, xs, device, dtype)``.

perceptrain's signature and meaning: the step minimises the batch loss L(θ) returned by
``loss_fn(xs, model) -> (loss, metrics)`` (``xs`` is the batch, ``None`` when the model
needs no data) with any ``torch.optim.Optimizer``. The forward and backward pass live in
a *closure* handed to ``optimizer.step``, so optimizers that re-evaluate the loss during a
step (L-BFGS, Nocedal & Wright 2006, ch. 7, with its line search) work unchanged;
first-order optimizers call the closure once.

In a data-parallel run the model is wrapped in ``DistributedDataParallel``, whose
backward pass averages the gradients over the processes, so every process takes the same
step. L-BFGS also compares loss values inside its step; the closure then returns the loss
averaged over the processes, so every process takes the same decisions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._loss import loss_and_metrics

__all__ = ["optimize_step"]


def _to(value: Any, device: torch.device | str | None, dtype: torch.dtype | None) -> Any:
    if isinstance(value, torch.Tensor):
        # Only floating tensors take the training dtype: class labels must stay integers.
        target_dtype = dtype if dtype is not None and value.is_floating_point() else None
        return value.to(device=device, dtype=target_dtype, non_blocking=True)
    if isinstance(value, list | tuple):
        return type(value)(_to(v, device, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device, dtype) for k, v in value.items()}
    return value


def _is_distributed(model: nn.Module) -> bool:
    return (
        isinstance(model, nn.parallel.DistributedDataParallel)
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def _global_mean(value: torch.Tensor) -> torch.Tensor:
    reduced = value.detach().clone()
    torch.distributed.all_reduce(reduced)
    return reduced / torch.distributed.get_world_size()


def _detach_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in metrics.items()}


def optimize_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[..., Any],
    xs: Any,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    grad_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Take one step of ``optimizer`` on the batch ``xs``; return the detached loss and metrics.

    Arguments:
        model: the model (or its DDP wrapper).
        optimizer: a torch optimizer; its ``step`` gets a closure, so LBFGS works too.
        loss_fn: ``loss_fn(xs, model) -> (loss, metrics)``.
        xs: the batch; its tensors go to ``device``, floating ones to ``dtype`` (the
            trainer has moved them already).
        device: where the batch's tensors go (``None``: where they are).
        dtype: the dtype of the batch's floating tensors (``None``: their own).
        grad_clip: bounds the gradient norm before the step (``None``: unclipped).

    Returns:
        ``(loss, metrics)``, detached; the loss is the value at the parameters the step
        started from.
    """
    batch = _to(xs, device, dtype)
    distributed = _is_distributed(model)
    reevaluates = isinstance(optimizer, torch.optim.LBFGS)
    record: dict[str, Any] = {}

    def closure() -> Any:
        optimizer.zero_grad(set_to_none=True)
        loss, metrics = loss_and_metrics(loss_fn(batch, model))
        loss.backward()
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if "loss" not in record:
            record["loss"] = loss.detach()
            record["metrics"] = _detach_metrics(metrics)
        if distributed and reevaluates:
            return _global_mean(loss)
        return loss

    optimizer.step(closure)
    return record["loss"], record["metrics"]


def _accumulate_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[..., Any],
    batches: list[Any],
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    *,
    grad_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """One step on the mean loss of several batches (gradient accumulation).

    ∇L = (1/a) Σᵢ ∇Lᵢ over the ``a`` batches; under DDP the gradient is only averaged
    across processes on the last batch (``no_sync`` before), which gives the same sum.
    """
    optimizer.zero_grad(set_to_none=True)
    total: torch.Tensor | None = None
    merged: dict[str, Any] = {}
    count = len(batches)
    for index, batch in enumerate(batches):
        batch = _to(batch, device, dtype)
        sync = index == count - 1 or not isinstance(model, nn.parallel.DistributedDataParallel)
        context = contextlib.nullcontext() if sync else model.no_sync()  # type: ignore[operator]
        with context:
            loss, metrics = loss_and_metrics(loss_fn(batch, model))
            (loss / count).backward()
        total = loss.detach() / count if total is None else total + loss.detach() / count
        for key, value in _detach_metrics(metrics).items():
            merged[key] = merged.get(key, 0) + value / count
    if grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    assert total is not None
    return total, merged
