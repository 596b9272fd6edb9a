"""The functions ``_curve.compiled_lm`` traces: the phases of one batched LM iteration
(``_curve.batched_lm.phases``) as functions of flat lists of tensors, and the inverse of
JᵀJ for the covariance.

``make_fx`` and AOTInductor see tensors only, so a ``BatchState``, a ``BatchData`` and a
phase's results are passed as their tensors in a fixed order (``fits_listed``,
``data_listed``; an empty tensor for a w or mask that is None, and for the fields a
phase does not read) and rebuilt inside (``data_built``). The arithmetic is ``phases``'s
own, not a second copy. ``evaluation`` (the model's: f, J and the reductions over the
points, traced under ``normal.fused`` so that JᵀJ and Jᵀr̃ are sums the compiler fuses
with J's producer) is a model's kernel; ``attempting`` and ``deciding`` (the damped
solve and the acceptance) read one value, vector or matrix per fit only, so that one
kernel of each serves every model of a parameter count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields

import torch

from . import normal, phases
from .state import BatchData, BatchModel, BatchState

__all__ = [
    "FITS",
    "attempting",
    "data_built",
    "data_listed",
    "deciding",
    "evaluation",
    "fits_built",
    "fits_listed",
    "gram_inverse",
]

#: A state's fields of one value, vector or matrix per fit (not r, the row scales and
#: r̃, one value per point), in the order of the traced functions' inputs and outputs.
#: p first: the P of a traced function's first input chooses the written-out algebra.
FITS = ("p", *(f.name for f in fields(BatchState) if f.name not in ("p", "r", "rows", "rs")))


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


def fits_listed(state: BatchState) -> list[torch.Tensor]:
    """``state``'s fields of one value, vector or matrix per fit, in the order of ``FITS``."""
    return [getattr(state, name) for name in FITS]


def fits_built(tensors: Sequence[torch.Tensor], points: BatchState | None = None) -> BatchState:
    """The ``BatchState`` of ``fits_listed``'s tensors, with ``points``'s per-point fields
    (r, the row scales, r̃), or empty ones where a phase does not read them."""
    fields_ = dict(zip(FITS, tensors, strict=True))
    if points is None:
        empty = fields_["p"][:, :0]
        return BatchState(r=empty, rows=empty, rs=empty, **fields_)
    return BatchState(r=points.r, rows=points.rows, rs=points.rs, **fields_)


def evaluation(model: BatchModel, like: BatchData) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``phases.evaluate`` as a function of p's and the data's tensors (``data_listed``),
    giving an ``Evaluation``'s tensors but J."""

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with normal.fused():
            e = phases.evaluate(model, tensors[0], data_built(tensors[1:], like))
        return _own(tensors, (*e.reduced().values(), e.finite))

    return run


def attempting(gtol: float, max_nfev: int) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``phases.attempt`` as a function of the state's ``fits_listed`` tensors, ‖r̃‖² and
    the bounds, giving an ``Attempt``'s tensors."""

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        size2, lower, upper = tensors[len(FITS) :]
        s = fits_built(tensors[: len(FITS)])
        a = phases.attempt(s, size2, (lower, upper), gtol, max_nfev)
        return (a.trial, a.step, a.solved, a.status)

    return run


def deciding(tol: dict[str, float], linear: bool) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``phases.decide`` as a function of the state's ``fits_listed`` tensors, an
    ``Attempt``'s four, the evaluation's cost, J̃ᵀJ̃, J̃ᵀr̃ and finiteness, and ‖r̃‖²,
    giving the new state's ``fits_listed`` tensors and the fits that accepted."""

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        count = len(FITS)
        s = fits_built(tensors[:count])
        a = phases.Attempt(*tensors[count : count + 4])
        cost, gram, g, finite, size2 = tensors[count + 4 :]
        empty = s.r
        e = phases.Evaluation(empty, cost, empty, empty, gram, g, finite)
        new, accept = phases.decide(s, a, e, size2, tol, linear)
        return _own(tensors, (*fits_listed(new), accept))

    return run


def _own(
    inputs: tuple[torch.Tensor, ...], outputs: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    """``outputs``, each copied where it shares memory with an input or an earlier output
    (r̃ is r for the linear loss): a compiled kernel's outputs are buffers of its own,
    which the eager state may then hold as distinct fields."""
    held = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    owned = []
    for tensor in outputs:
        where = tensor.untyped_storage().data_ptr()
        owned.append(tensor.clone() if tensor.numel() and where in held else tensor)
        held.add(where)
    return tuple(owned)


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
