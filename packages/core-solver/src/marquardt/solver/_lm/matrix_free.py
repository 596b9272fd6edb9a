"""The matrix-free system: A = JᵀJ/N as an operator, `matrix_free_system`.

Where neither ``JᵀJ`` (P × P) nor ``JJᵀ`` (N × N) fits, the step's system keeps ``a`` as the
operator ``v ↦ Av``, which the Jacobian engine forms from one Jacobian-vector and one
vector-Jacobian product per slice (``marquardt.jacobian.GaussNewtonProducts``; Schraudolph
2002; Martens 2010), with g = Jᵀr/N and the Hutchinson estimate d̂ of diag(JᵀJ)/N. A is
never formed; the conjugate gradients of ``solve.cg`` solve it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from marquardt.jacobian import GaussNewtonProducts

from .._backends.base import LinearSystem

__all__ = ["GaussNewtonOperator", "matrix_free_system"]


class GaussNewtonOperator:
    """A = JᵀJ/N as a function of v (float64 P-vectors), from the engine's products;
    ``reduce`` sums a rank's share over a process group (None: one process)."""

    def __init__(
        self,
        products: GaussNewtonProducts,
        rows: int,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.products = products
        self.rows = rows
        self._reduce = reduce

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        return self.block(v.reshape(1, -1)).reshape(-1)

    def block(self, vs: torch.Tensor) -> torch.Tensor:
        """A applied to each row of ``vs`` (k × P), as rows."""
        out = self.products.block(vs)
        if self._reduce is not None:
            out = self._reduce(out)
        return out / self.rows


def matrix_free_system(
    products: GaussNewtonProducts,
    *,
    rows: int,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> LinearSystem:
    """The step's system with ``a`` the operator A (see the module docstring): g = Jᵀr/N
    and diag = d̂ (the estimate of diag(JᵀJ)/N), from products summed over the ranks."""
    return LinearSystem(
        a=GaussNewtonOperator(products, rows, reduce),
        g=products.jtr / rows,
        diag=products.diagonal() / rows,
        rows=int(rows),
        params=int(products.jtr.numel()),
        underdetermined=False,
        rss=float(products.rss),
    )
