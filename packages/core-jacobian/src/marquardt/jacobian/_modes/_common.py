"""Shared pieces of the Jacobian modes."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._errors import ResidualDetachedError, ResidualShapeError, message

__all__ = ["ResidualFn", "require_graph", "rows_of"]

ResidualFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
