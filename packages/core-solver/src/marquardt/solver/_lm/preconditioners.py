"""Preconditioners of the matrix-free damped system B = A + λD: `PRECONDITIONERS`.

CG on B x = g converges in a number of iterations set by the spread of the spectrum of
M⁻¹B (Hestenes & Stiefel 1952); a preconditioner M ≈ B makes a handful of iterations
count. Each is built once per step (A and D are fixed within a step, only λ changes from
attempt to attempt) and applied as z = M⁻¹r for the attempt's λ:

* ``jacobi``: M = d̂ + λD, with d̂ the Hutchinson estimate of diag(A);
* ``nystrom``: the randomized Nyström preconditioner (Frangella, Tropp & Udell 2023,
  "Randomized Nyström preconditioning", SIAM J. Matrix Anal. Appl. 44). In the variables
  y = D^½x the system is (Ã + λI)y = D^-½g with Ã = D^-½AD^-½ (unit diagonal for
  Marquardt's D). A rank-k sketch Ã ≈ UΛ̂Uᵀ is formed from k products ÃΩ (one block of
  products, Ω a random orthonormal P × k test matrix), stably (a shift ν = √P·eps·‖Y‖
  before the Cholesky factor of ΩᵀY, Tropp et al. 2017); then
  M⁻¹ = D^-½ [U(Λ̂ + λI)⁻¹Uᵀ + (I − UUᵀ)/(λ̂ₖ + λ)] D^-½: the top of the spectrum is
  inverted exactly, the rest is flattened at the sketch's smallest kept eigenvalue λ̂ₖ.
  The k products are spent once per step; the sketch costs O(P·k) memory.

Both see the same operator as CG (the step's curvature subsample, when there is one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = ["PRECONDITIONERS", "Jacobi", "Nystrom", "Preconditioner", "nystrom_sketch"]

Operator = Callable[[torch.Tensor], torch.Tensor]


class Preconditioner(Protocol):
    """z = M⁻¹r for the damping λ of an attempt."""

    def apply(self, r: torch.Tensor, lam: float) -> torch.Tensor:
        """M⁻¹r (float64, P)."""


@dataclass(frozen=True)
class Jacobi:
    """M = d̂ + λD: ``estimate`` d̂ (the diagonal's estimate, floored), ``d`` D."""

    estimate: torch.Tensor
    d: torch.Tensor

    def apply(self, r: torch.Tensor, lam: float) -> torch.Tensor:
        """r / (d̂ + λD)."""
        return r / (self.estimate + lam * self.d)


@dataclass(frozen=True)
class Nystrom:
    """The Nyström preconditioner of (Ã + λI), Ã = SAS with S = ``scale`` = D^-½:
    ``basis`` U (P × k, orthonormal columns) and ``values`` Λ̂ (k, descending, ≥ 0)."""

    scale: torch.Tensor
    basis: torch.Tensor
    values: torch.Tensor

    def apply(self, r: torch.Tensor, lam: float) -> torch.Tensor:
        """S[U(Λ̂ + λ)⁻¹Uᵀ + (I − UUᵀ)/(λ̂ₖ + λ)]Sr."""
        w = self.scale * r
        coeff = self.basis.T @ w
        floor = float(self.values[-1]) + lam
        inside = self.basis @ (coeff / (self.values + lam))
        outside = (w - self.basis @ coeff) / floor
        return self.scale * (inside + outside)


def nystrom_sketch(
    block: Callable[[torch.Tensor], torch.Tensor],
    params: int,
    rank: int,
    generator: torch.Generator,
    *,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, Λ̂) of the rank-``rank`` Nyström approximation of the SPD operator whose
    products of a block (k × P rows) ``block`` forms (Frangella, Tropp & Udell 2023, Alg. 2.1).

    Arguments:
        block: V (k × P) ↦ the products of its rows, as rows (k × P, float64).
        params: P.
        rank: k (at most P).
        generator: the random test matrix's generator (CPU).
        device: where U and Λ̂ live.

    Returns:
        U (P × k) and Λ̂ (k,), descending, clamped at 0.
    """
    k = max(1, min(rank, params))
    omega = torch.randn(params, k, generator=generator, dtype=torch.float64)
    omega = torch.linalg.qr(omega.to(device)).Q
    y = block(omega.T.contiguous()).T
    shift = params**0.5 * torch.finfo(torch.float64).eps * float(y.norm())
    y = y + shift * omega
    small = omega.T @ y
    small = 0.5 * (small + small.T)
    factor, info = torch.linalg.cholesky_ex(small)
    if int(info) != 0:
        # Rounding made ΩᵀY indefinite: a larger shift, once.
        shift_more = float(torch.linalg.eigvalsh(small)[0].abs()) + shift
        y = y + shift_more * omega
        small = small + shift_more * torch.eye(k, dtype=small.dtype, device=small.device)
        factor = torch.linalg.cholesky(small)
        shift += shift_more
    b = torch.linalg.solve_triangular(factor, y.T, upper=False).T
    u, sigma, _ = torch.linalg.svd(b, full_matrices=False)
    values = (sigma.pow(2) - shift).clamp_min(0.0)
    return u, values


def _nystrom(
    block: Callable[[torch.Tensor], torch.Tensor],
    estimate: torch.Tensor,
    d: torch.Tensor,
    rank: int,
    generator: torch.Generator,
) -> Preconditioner:
    scale = d.rsqrt()

    def scaled(vs: torch.Tensor) -> torch.Tensor:
        return block(vs * scale) * scale

    u, values = nystrom_sketch(scaled, int(d.numel()), rank, generator, device=d.device)
    return Nystrom(scale, u, values)


Builder = Callable[
    [Callable[[torch.Tensor], torch.Tensor], torch.Tensor, torch.Tensor, int, torch.Generator],
    Preconditioner,
]
#: name -> builder(block, d̂, D, rank, generator): the preconditioner of one step.
PRECONDITIONERS: dict[str, Builder] = {
    "jacobi": lambda block, estimate, d, rank, generator: Jacobi(estimate, d),
    "nystrom": _nystrom,
}
