"""Shared pieces of the Jacobian modes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import jacrev, vmap

from .._errors import ResidualDetachedError, ResidualShapeError, message
from .._points import ResidualFn

__all__ = ["ResidualFn", "per_sample_jacrev", "recorded_forward", "require_graph", "rows_of"]

Record = tuple[nn.Module, torch.Tensor, torch.Tensor]


def rows_of(residuals: torch.Tensor, batch: int) -> torch.Tensor:
    """The residuals of ``batch`` samples as a ``batch × m`` matrix (sample-major rows)."""
    if residuals.dim() == 0 or residuals.shape[0] != batch or residuals.numel() % batch != 0:
        raise ResidualShapeError(
            message(
                f"residual_fn was expected to return one or more residuals per sample for "
                f"a batch of {batch} (a tensor of shape ({batch}, ...))",
                f"it returned a tensor of shape {tuple(residuals.shape)}",
                "return per-sample residuals without reducing over the batch, e.g. "
                "lambda a, b: a - b or cross_entropy(..., reduction='none')",
            )
        )
    return residuals.reshape(batch, -1)


def require_graph(residuals: torch.Tensor) -> None:
    """Refuse residuals with no autograd graph: they have no Jacobian to compute."""
    if not residuals.requires_grad:
        raise ResidualDetachedError(
            message(
                "the Jacobian of residual_fn(model(x), y) with respect to the parameters was "
                "requested",
                "the residuals do not depend on any trainable parameter (no autograd graph)",
                "do not detach the model output or call .item()/.numpy() in residual_fn",
            )
        )


def recorded_forward(
    model: nn.Module,
    owners: Sequence[nn.Module],
    residual_fn: ResidualFn,
    x: torch.Tensor,
    y: torch.Tensor,
) -> tuple[list[Record], torch.Tensor]:
    """One forward pass with a graph, recording (module, its input, its output) of every
    module in ``owners``; returns the records and the ``b × m`` residuals (graph checked)."""
    records: list[Record] = []

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        records.append((module, args[0].detach(), output))

    handles = [m.register_forward_hook(hook) for m in owners]
    try:
        with torch.enable_grad():
            prediction = model(x)
            res = rows_of(residual_fn(prediction, y), x.shape[0])
    finally:
        for h in handles:
            h.remove()
    require_graph(res)
    return records, res


def per_sample_jacrev(
    residual_of: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor],
    samples_per_call: int,
    batch: int,
) -> Callable[..., tuple[Any, torch.Tensor]]:
    """``f(primals, x, y) -> (∂r/∂primals, r)`` per sample, vmapped over the batch in chunks
    of ``samples_per_call``; ``residual_of(primals, xi, yi)`` is one sample's residuals."""

    def one_sample(primals: Any, xi: torch.Tensor, yi: torch.Tensor) -> tuple[torch.Tensor, ...]:
        r = residual_of(primals, xi, yi)
        return r, r

    return vmap(
        jacrev(one_sample, has_aux=True),
        in_dims=(None, 0, 0),
        randomness="different",
        chunk_size=max(1, min(samples_per_call, batch)),
    )
