"""What the backends share in assembling and reading a `LinearSystem`.

The array calls in which NumPy, torch and cuPyNumeric differ are an `ArrayOps`; with them,
`system_from_matrix` and `normal_system` build every backend's system (from an explicit J
or from accumulated products), `gather_slices` writes J's slices into a backend's arrays,
`model_terms` and `solution` give the quadratic model's δᵀg and δᵀAδ of a solve
(``base.py``, ``Solution``), and `read_values` / `host_vector` read small results back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marquardt.jacobian import JacobianSlice

from .base import LinearSystem, Solution

__all__ = [
    "ArrayOps",
    "gather_slices",
    "host_vector",
    "model_terms",
    "normal_system",
    "read_values",
    "solution",
    "system_from_matrix",
]


@dataclass(frozen=True)
class ArrayOps:
    """The array calls in which the backends' assembly differs (NumPy, torch, cuPyNumeric).

    ``float64(x)``: ``x`` as float64 (the same array when it already is);
    ``column_squares(J)``: Σᵢ Jᵢⱼ² for each column j, accumulated in float64;
    ``diagonal(A)``: a copy of A's diagonal;
    ``gram(M)``: MᵀM in float64, formed in M's dtype (default ``M.T @ M``; a backend
    passes a symmetric rank-k update where it has one);
    ``column_terms(J, r)``: (column squares, Jᵀr) in float64 in one pass over J (default:
    two passes).
    """

    float64: Callable[[Any], Any]
    column_squares: Callable[[Any], Any]
    diagonal: Callable[[Any], Any]
    gram: Callable[[Any], Any] | None = None
    column_terms: Callable[[Any, Any], tuple[Any, Any]] | None = None

    def gram_of(self, m: Any) -> Any:
        """MᵀM in float64."""
        return self.gram(m) if self.gram is not None else self.float64(m.T @ m)

    def column_terms_of(self, jac: Any, res: Any) -> tuple[Any, Any]:
        """(Σᵢ Jᵢⱼ², Jᵀr) in float64."""
        if self.column_terms is not None:
            return self.column_terms(jac, res)
        return self.column_squares(jac), self.float64(jac.T @ res)


def read_values(values: Iterable[float | torch.Tensor]) -> list[float]:
    """The values as Python floats, with one device-to-host transfer per device.

    Tensors (0-dim, any device) are stacked per device and copied at once; this is where
    a step waits for its device, once per attempt.
    """
    items = list(values)
    out = [0.0] * len(items)
    groups: dict[torch.device, list[int]] = {}
    for i, v in enumerate(items):
        if isinstance(v, torch.Tensor):
            groups.setdefault(v.device, []).append(i)
        else:
            out[i] = float(v)
    for indices in groups.values():
        stacked = torch.stack([items[i].detach().to(torch.float64).reshape(()) for i in indices])  # type: ignore[union-attr]
        for i, value in zip(indices, stacked.tolist(), strict=True):
            out[i] = float(value)
    return out


def gather_slices(
    slices: Iterable[JacobianSlice],
    rows: int,
    params: int,
    *,
    native: Callable[[torch.Tensor], Any],
    empty: Callable[[tuple[int, ...], Any], Any],
) -> tuple[Any, Any]:
    """J (rows × params) and r (rows,) in one backend's arrays, slice by slice.

    ``native(t)`` turns a slice's tensor into the backend's array (zero-copy where it
    can: the slices' buffers are never reused by their producer); ``empty(shape, dtype)``
    allocates. Every row is written exactly once, in whatever order the slices come.
    """
    jac: Any = None
    res: Any = None
    for piece in slices:
        j = native(piece.jacobian)
        r = native(piece.residuals.reshape(-1))
        if jac is None:
            jac = empty((rows, params), j.dtype)
            res = empty((rows,), r.dtype)
        jac[piece.start : piece.stop] = j
        res[piece.start : piece.stop] = r
    if jac is None:
        raise ValueError(
            f"system_from_slices got no slices for {rows} rows. "
            "HINT: the Jacobian engine yielded nothing; check the batch is not empty."
        )
    return jac, res


def model_terms(system: LinearSystem, solved: Any) -> tuple[float, float]:
    """(δᵀg, δᵀAδ) of the quadratic model, ``g`` = Jᵀr/N, A = JᵀJ/N (see ``Solution``).

    Over-determined, ``solved`` is δ itself. Under-determined it is u with δ = Jᵀu, and
    Jδ = JJᵀu = N·Bu gives δᵀJᵀr/N = N·(Bu)ᵀ(r/N) and ‖Jδ‖²/N = N·‖Bu‖² without forming
    Jδ. Works for NumPy, torch and cuPyNumeric vectors alike.
    """
    a = system.a
    if system.underdetermined:
        bu = a @ solved
        n = system.rows
        return float(n * (bu @ system.g)), float(n * (bu @ bu))
    return float(solved @ system.g), float(solved @ (a @ solved))


def solution(system: LinearSystem, solved: Any, delta: torch.Tensor, damping: float) -> Solution:
    """The ``Solution`` for δ (``delta``, float64 on the CPU) solved with λ = ``damping``.

    ``solved`` is what the damped system was solved for, in backend arrays: δ itself when
    over-determined, u (δ = Jᵀu) when under-determined; the quadratic model's terms come
    from it (``model_terms``).
    """
    gradient_dot, curvature = model_terms(system, solved)
    return Solution(
        delta=delta,
        gradient_dot=float(gradient_dot),
        curvature=float(curvature),
        damping=float(damping),
    )


def normal_system(a: Any, g: Any, *, rows: int, rss: float, ops: ArrayOps) -> LinearSystem:
    """The over-determined system from A = JᵀJ/N (P × P) and g = Jᵀr/N (P,), float64 arrays.

    diag(JᵀJ)/N is a copy of A's diagonal (``ops.diagonal``). Every backend builds its
    over-determined system here, from accumulated products or from an explicit J.
    """
    return LinearSystem(
        a=a,
        g=g,
        diag=ops.diagonal(a),
        rows=int(rows),
        params=int(a.shape[0]),
        underdetermined=False,
        rss=float(rss),
    )


def system_from_matrix(jac: Any, res: Any, ops: ArrayOps) -> LinearSystem:
    """The system for an explicit J (N × P) and r (N,), in the arrays ``ops`` work on.

    Over-determined (N ≥ P): A = JᵀJ/N, g = Jᵀr/N, and diag(JᵀJ)/N is A's diagonal (no
    second pass over J). Under-determined: B = JJᵀ/N, g = r/N, J kept for δ = Jᵀu, and
    the column norms of J for Marquardt scaling and the gtol test. Products are formed in
    J's dtype and held in float64.
    """
    n, p = int(jac.shape[0]), int(jac.shape[1])
    r64 = ops.float64(res)
    rss = float(r64 @ r64)
    if n >= p:
        gradient = ops.float64(jac.T @ res) / n
        return normal_system(ops.gram_of(jac) / n, gradient, rows=n, rss=rss, ops=ops)
    squares, jtr = ops.column_terms_of(jac, res)
    gradient = jtr / n
    return LinearSystem(
        a=ops.gram_of(jac.T) / n,
        g=r64 / n,
        diag=squares / n,
        rows=n,
        params=p,
        underdetermined=True,
        rss=rss,
        jacobian=jac,
        gradient=gradient,
    )


def host_vector(array: Any) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A backend-native vector as a float64 NumPy array on the host (a copy when needed).

    Works for torch tensors (any device), NumPy arrays and any array exposing
    ``__array__`` (cuPyNumeric). Used for small (P,) vectors only, e.g. the gtol test.
    """
    if isinstance(array, torch.Tensor):
        return array.detach().to("cpu", torch.float64).numpy()
    return np.asarray(array, dtype=np.float64)
