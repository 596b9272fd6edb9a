"""The functions ``_curve.compiled_lm`` traces: one batched LM step (the start state or one
iteration, chosen by a flag) as a function of flat lists of tensors, and the inverse of JᵀJ
for the covariance.

``make_fx`` and AOTInductor see tensors only, so a ``BatchState`` and a ``BatchData`` are
passed as their tensors in a fixed order (``state_listed``, ``data_listed``; an empty
tensor for a w or mask that is None) and rebuilt inside (``data_built``). The arithmetic
is ``batched``'s own (``_iterate``, ``start_state``), not a second copy, traced under
``normal.fused`` so that JᵀJ and Jᵀr̃ are sums the compiler fuses with J's producer. The
start and the iteration are two branches of one graph (``step``, a ``torch.cond`` on its
last input), so that a model's kernels are one compiled package, not two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import torch
from torch._higher_order_ops.cond import cond_op

from . import normal
from .driver import BatchData, BatchModel, BatchState, _iterate, start_state

__all__ = [
    "STATE",
    "blank",
    "branch",
    "data_built",
    "data_listed",
    "gram_inverse",
    "iteration",
    "start",
    "state_listed",
    "step",
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


def step(
    model: BatchModel, like: BatchData, tol: dict[str, float], max_nfev: int
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``start`` or ``iteration`` as one function of the state's tensors, the data's and a
    flag last (``branch``): True runs ``start_state`` from the state's p (its other tensors
    are not read: ``blank``), False one iteration. Traced, the two are the branches of
    one ``torch.cond``, compiled together."""
    first = start(model, like)
    later = iteration(model, like, tol, max_nfev)

    def begin(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _own(tensors, first(tensors[0], *tensors[len(STATE) :]))

    def go(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _own(tensors, later(*tensors))

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # The operator itself, not ``torch.cond``, which would trace the branches with
        # dynamo: under ``make_fx`` the operator traces each branch as this graph's own.
        return tuple(cond_op(tensors[-1], begin, go, tuple(tensors[:-1])))

    return run


def _own(
    inputs: tuple[torch.Tensor, ...], outputs: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    """``outputs``, each copied where it shares memory with an input or an earlier output
    (the start's r̃ is r for the linear loss): a branch of ``torch.cond`` returns tensors
    of its own."""
    held = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    owned = []
    for tensor in outputs:
        where = tensor.untyped_storage().data_ptr()
        owned.append(tensor.clone() if tensor.numel() and where in held else tensor)
        held.add(where)
    return tuple(owned)


def branch(first: bool, device: torch.device) -> torch.Tensor:
    """``step``'s flag: True for the start, False for an iteration."""
    return torch.tensor(first, device=device)


def blank(p0: torch.Tensor, data: BatchData) -> BatchState:
    """The state ``step``'s start branch is given: p0 as p, the other tensors allocated at
    their shapes and dtypes but never read (each its own: a graph's inputs are distinct)."""
    fits, size = p0.shape
    shapes = {"r": data.y.shape, "rows": data.y.shape, "rs": data.y.shape, "gram": (size, size)}
    shapes.update(g=(size,), d=(size,))
    tensors: dict[str, torch.Tensor] = {"p": p0}
    for name in STATE[1:]:
        shape = shapes.get(name, ())
        kind = torch.int64 if name in ("nfev", "njev", "steps", "status") else p0.dtype
        shape = tuple(shape) if name in ("r", "rows", "rs") else (fits, *shape)
        tensors[name] = torch.empty(shape, dtype=kind, device=p0.device)
    return BatchState(**tensors)


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
