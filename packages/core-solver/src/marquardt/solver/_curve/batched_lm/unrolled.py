"""Cholesky factorisation and solves of many small systems, written out entry by entry.

For M symmetric positive definite P × P systems A_m x_m = b_m with small P, LAPACK's
batched routines loop over the matrices one call at a time. Written out, the
factorisation A = LLᵀ is, for j = 1..P,

    L_jj = √(A_jj − Σ_{k<j} L_jk²),   L_ij = (A_ij − Σ_{k<j} L_ik L_jk) / L_jj  (i > j),

and the solve is L z = b by forward and Lᵀ x = z by back substitution: O(P³) operations,
each on a vector of M entries, which a compiler fuses into one loop over the systems.
``decompositions`` maps ATen's ``linalg_cholesky_ex`` and ``cholesky_solve`` to these for
``make_fx`` when P ≤ ``UNROLL_MOST`` (``_curve.compiled_lm`` traces with it); above that the
ATen operations stay.

As LAPACK's ``potrf``, the factorisation reports in ``info`` the (1-based) order of the
first leading minor that is not positive definite (0 when all are); past that pivot the
factor's entries are not LAPACK's (its pivot is replaced by 1 to keep them finite), and
callers use neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["UNROLL_MOST", "cholesky_ex", "cholesky_solve", "decompositions"]

#: The largest P written out (P(P+1)/2 factor entries, O(P³) vector operations).
UNROLL_MOST = 12


def cholesky_ex(
    a: torch.Tensor, *, upper: bool = False, check_errors: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, info) of ``torch.linalg.cholesky_ex`` for a (..., P, P) batch (lower L, or Lᵀ
    for ``upper``), written out; ``check_errors`` raises as torch's does."""
    size = a.shape[-1]
    rows: list[list[torch.Tensor]] = [[] for _ in range(size)]
    info = torch.zeros(a.shape[:-2], dtype=torch.int32, device=a.device)
    one = torch.ones((), dtype=a.dtype, device=a.device)
    for j in range(size):
        pivot = a[..., j, j] - sum((rows[j][k] ** 2 for k in range(j)), torch.zeros_like(one))
        bad = ~(pivot > 0)
        info = torch.where((info == 0) & bad, j + 1, info)
        diagonal = torch.sqrt(torch.where(bad, one, pivot))
        rows[j].append(diagonal)
        for i in range(j + 1, size):
            dot = sum((rows[i][k] * rows[j][k] for k in range(j)), torch.zeros_like(one))
            rows[i].append((a[..., i, j] - dot) / diagonal)
    zero = torch.zeros_like(a[..., 0, 0])
    factor = torch.stack(
        [torch.stack(rows[i] + [zero] * (size - i - 1), dim=-1) for i in range(size)], dim=-2
    )
    if check_errors and bool((info > 0).any()):
        raise torch.linalg.LinAlgError(  # type: ignore[attr-defined]
            "the matrix is not positive definite"
        )
    return (factor.transpose(-2, -1) if upper else factor), info


def cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    """``torch.cholesky_solve(b, factor, upper)``: x with LLᵀx = b for b (..., P, K)."""
    lower = factor.transpose(-2, -1) if upper else factor
    size = lower.shape[-1]
    z: list[torch.Tensor] = []
    for i in range(size):
        rest = sum(
            (lower[..., i, k, None] * z[k] for k in range(i)), torch.zeros_like(b[..., 0, :])
        )
        z.append((b[..., i, :] - rest) / lower[..., i, i, None])
    x: list[torch.Tensor] = [torch.zeros_like(z[0])] * size
    for i in reversed(range(size)):
        rest = sum(
            (lower[..., k, i, None] * x[k] for k in range(i + 1, size)),
            torch.zeros_like(b[..., 0, :]),
        )
        x[i] = (z[i] - rest) / lower[..., i, i, None]
    return torch.stack(x, dim=-2)


def decompositions(params: int) -> dict[Any, Callable[..., Any]]:
    """``make_fx``'s ``decomposition_table`` for P × P systems: the two written out when
    P ≤ ``UNROLL_MOST``, else empty (LAPACK's stay)."""
    if params > UNROLL_MOST:
        return {}
    return {
        torch.ops.aten.linalg_cholesky_ex.default: cholesky_ex,
        torch.ops.aten.cholesky_solve.default: cholesky_solve,
    }
