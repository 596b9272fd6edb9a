"""The normal equations of many small fits, formed without keeping J.

For fits of N points and P parameters, with J̃ the Jacobian with its rows scaled and r̃
the scaled residuals, an iteration needs J̃ᵀJ̃ (P × P), J̃ᵀr̃ (P) and the linear model's
reduction at a step s. ``products`` forms the first two: eagerly as two batched matrix
products (one call each); under ``fused`` (what ``_curve.batched_lm.traced`` traces with) as
P(P+1)/2 + P sums over the points of products of J̃'s columns, which the compiler fuses,
with the forward-mode pass that produces the columns, into one kernel over the fits
instead of an external matrix product reading J̃ back (eagerly those sums would be as
many passes over memory). Both are the same sums, in another order. The reduction of the linear model
is then C − ½‖r̃ + J̃s‖² = C − ½‖r̃‖² − sᵀJ̃ᵀr̃ − ½sᵀJ̃ᵀJ̃s, from the kept products alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from ... import _rules

__all__ = ["column_norms", "finite", "fused", "predicted", "products"]

_FUSED: ContextVar[bool] = ContextVar("fused", default=False)


@contextmanager
def fused() -> Iterator[None]:
    """Within it, ``products`` forms its sums column by column (module docstring)."""
    token = _FUSED.set(True)
    try:
        yield
    finally:
        _FUSED.reset(token)


def products(js: torch.Tensor, rs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(J̃ᵀJ̃, J̃ᵀr̃) per fit.

    **Arguments:**

    - ``js``: J̃ (M × N × P); ``rs``: r̃ (M × N).

    **Returns:** (J̃ᵀJ̃ (M × P × P), J̃ᵀr̃ (M × P)).
    """
    if not _FUSED.get():
        return torch.einsum("mnp,mnq->mpq", js, js), torch.einsum("mnp,mn->mp", js, rs)
    columns = js.unbind(-1)
    size = len(columns)
    upper = {(i, k): (columns[i] * columns[k]).sum(1) for i in range(size) for k in range(i, size)}
    gram = torch.stack(
        [
            torch.stack([upper[(min(i, k), max(i, k))] for k in range(size)], dim=-1)
            for i in range(size)
        ],
        dim=-2,
    )
    return gram, torch.stack([(column * rs).sum(1) for column in columns], dim=-1)


def column_norms(gram: torch.Tensor) -> torch.Tensor:
    """‖J̃_j‖ of each column: the square root of J̃ᵀJ̃'s diagonal (M × P)."""
    return torch.sqrt(torch.diagonal(gram, dim1=-2, dim2=-1))


def finite(r: torch.Tensor, gram: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Whether each fit's r, J̃ᵀJ̃ and J̃ᵀr̃ are finite (M,): a NaN or infinite entry of J̃
    leaves a NaN or infinite product."""
    return torch.isfinite(r.sum(1) + gram.sum((1, 2)) + g.sum(1))


def predicted(
    cost: torch.Tensor,
    size2: torch.Tensor,
    gram: torch.Tensor,
    g: torch.Tensor,
    step: torch.Tensor,
    linear: bool,
) -> torch.Tensor:
    """The linear model's reduction C − ½‖r̃ + J̃s‖² per fit (module docstring).

    **Arguments:**

    - ``cost``: C (M,); ``size2``: ‖r̃‖² (M,); ``gram``: J̃ᵀJ̃; ``g``: J̃ᵀr̃; ``step``: s (M × P).
    - ``linear``: whether every fit's loss is the linear one, where C = ½‖r̃‖² and the
      offset is 0 rather than cancelled in floating point.

    **Returns:** the predicted reduction (M,).
    """
    curvature = ((gram * step[:, :, None]).sum(1) * step).sum(1)
    offset = torch.zeros_like(cost) if linear else cost - 0.5 * size2
    reduction: torch.Tensor = _rules.predicted_reduction(offset, (g * step).sum(1), curvature)
    return reduction
