"""The functions ``_curve.compiled_lm`` traces: one batched LM iteration, the start
state, as functions of flat lists of tensors, and the inverse of JᵀJ for the covariance.

``make_fx`` and AOTInductor see tensors only, so a ``BatchState`` and a ``BatchData`` are
passed as their tensors in a fixed order (``state_listed``, ``data_listed``; an empty
tensor for a w or mask that is None) and rebuilt inside (``data_built``). The arithmetic
is ``batched``'s own (``_iterate``, ``start_state``), not a second copy, traced under
``normal.fused`` so that JᵀJ and Jᵀr̃ are sums the compiler fuses with J's producer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import torch

from . import normal
from .driver import BatchData, BatchModel, BatchState, _iterate, start_state

__all__ = [
    "STATE",
    "data_built",
    "data_listed",
    "gram_inverse",
    "iteration",
    "start",
    "state_listed",
]

#: The state's fields, in the order of the traced functions' inputs and outputs.
STATE = tuple(f.name for f in fields(BatchState))


def state_listed(state: BatchState) -> list[torch.Tensor]:
    """``state``'s tensors in the order of ``STATE``."""
    return [getattr(state, name) for name in STATE]


def data_listed(part: BatchData) -> list[torch.Tensor]:
    """``part``'s tensors in a fixed order (an empty one for a w or mask that is None)."""
    empty = part.y[:, :0]
    return [
        part.x,
        part.y,
        part.w if part.w is not None else empty,
        part.mask if part.mask is not None else empty,
        part.lower,
        part.upper,
        part.loss_index,
        part.f_scale,
    ]


def data_built(tensors: tuple[torch.Tensor, ...], like: BatchData) -> BatchData:
    """The ``BatchData`` of ``data_listed``'s tensors, with ``like``'s losses and Nones."""
    x, y, w, mask, lower, upper, loss_index, f_scale = tensors
    return BatchData(
        x,
        y,
        w if like.w is not None else None,
        mask if like.mask is not None else None,
        lower,
        upper,
        like.losses,
        loss_index,
        f_scale,
    )


def iteration(
    model: BatchModel, like: BatchData, tol: dict[str, float], max_nfev: int
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``_iterate`` as a function of the state's and the data's tensors."""

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = BatchState(*tensors[: len(STATE)])
        with normal.fused():
            new = _iterate(model, state, data_built(tensors[len(STATE) :], like), tol, max_nfev)
        return tuple(getattr(new, name) for name in STATE)

    return run


def start(model: BatchModel, like: BatchData) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``start_state`` as a function of p0's and the data's tensors."""

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with normal.fused():
            new = start_state(model, tensors[0], data_built(tensors[1:], like))
        return tuple(getattr(new, name) for name in STATE)

    return run


def gram_inverse(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(JᵀJ)⁻¹ per fit from the Cholesky factor of the equilibrated Gram matrix
    D⁻¹JᵀJD⁻¹ (D = its diagonal's square root), and whether that is trusted: the factor
    exists and no singular value of J is near SciPy's cut (the ratio of the factor's
    smallest to largest pivot above ε^¼), so the pseudo-inverse is the inverse.

    **Arguments:**

    - ``gram``: JᵀJ per fit (M × P × P), finite.

    **Returns:** ((JᵀJ)⁻¹ (M × P × P), meaningful where trusted; trusted (M,)).
    """
    scale = torch.sqrt(torch.diagonal(gram, dim1=1, dim2=2))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    factor, info = torch.linalg.cholesky_ex(gram / (scale[:, :, None] * scale[:, None, :]))
    diagonal = torch.diagonal(factor, dim1=1, dim2=2)
    ratio = diagonal.amin(1) / diagonal.amax(1)
    eps = torch.finfo(gram.dtype).eps
    good = (info == 0) & (ratio > eps**0.25) & torch.isfinite(ratio)
    eye = torch.eye(gram.shape[2], dtype=gram.dtype, device=gram.device).expand_as(gram)
    inverse = torch.cholesky_solve(eye, torch.where(good[:, None, None], factor, eye))
    return inverse / (scale[:, :, None] * scale[:, None, :]), good
