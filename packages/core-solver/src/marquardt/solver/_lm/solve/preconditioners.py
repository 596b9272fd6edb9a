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

    With Y_ν = Y + νΩ (the shifted products) and ΩᵀY_ν = FFᵀ, the approximation is BBᵀ with
    B = Y_νF⁻ᵀ. Every P-sized array is held as k rows and every factorisation is of a
    k × k matrix, so a step makes a few passes over k × P numbers instead of a tall QR and
    SVD (several times the cost): Ω is orthonormalised by one Cholesky QR (a Gaussian
    P × k block is well conditioned); B's left singular vectors are read from the
    eigenvectors of BᵀB (k × k), then re-orthonormalised from the rows actually formed
    (Cholesky QR) and rotated to the eigenvectors of BBᵀ in their span (Rayleigh-Ritz),
    which is the SVD in exact arithmetic. Where a k × k Cholesky factor fails (a sketch of
    numerical rank below k), the tall SVD is taken instead.

    Arguments:
        block: V (k × P) ↦ the products of its rows, as rows (k × P, float64).
        params: P.
        rank: k (at most P).
        generator: the random test matrix's generator (CPU).
        device: where U and Λ̂ live.

    Returns:
        U (P × k, orthonormal columns) and Λ̂ (k,), descending, clamped at 0.
    """
    k = max(1, min(rank, params))
    eye = torch.eye(k, dtype=torch.float64, device=device)
    # Drawn in float32: a Gaussian's precision does not matter once orthonormalised.
    omega = torch.randn(k, params, generator=generator).to(device, torch.float64)
    omega = _lower_inverse(torch.linalg.cholesky(omega @ omega.T), eye) @ omega
    y = block(omega)
    shift = params**0.5 * torch.finfo(torch.float64).eps * float(y.norm())
    small = omega @ y.T
    small = 0.5 * (small + small.T) + shift * eye  # Ωᵀ(Y + νΩ), ΩΩᵀ = I
    factor, info = torch.linalg.cholesky_ex(small)
    if int(info) != 0:
        # Rounding made ΩᵀY indefinite: a larger shift, once.
        shift_more = float(torch.linalg.eigvalsh(small)[0].abs()) + shift
        small = small + shift_more * eye
        factor = torch.linalg.cholesky(small)
        shift += shift_more
    z = y.add_(omega, alpha=shift)  # Y_ν, in place of the products
    f_inv = _lower_inverse(factor, eye)
    u, sigma2 = _left_singular(z, f_inv, eye)
    return u.T, (sigma2 - shift).clamp_min(0.0)


def _lower_inverse(factor: torch.Tensor, eye: torch.Tensor) -> torch.Tensor:
    """L⁻¹ of a k × k lower-triangular factor (applied to k × P rows as one product)."""
    inverse: torch.Tensor = torch.linalg.solve_triangular(factor, eye, upper=False)
    return inverse


def _left_singular(
    z: torch.Tensor, f_inv: torch.Tensor, eye: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The left singular vectors of B = zᵀF⁻ᵀ (P × k; ``z`` k × P, ``f_inv`` F⁻¹), as
    rows (k × P), and the squared singular values, descending (see `nystrom_sketch`)."""
    zz = z @ z.T
    sigma2, v = torch.linalg.eigh(f_inv @ zz @ f_inv.T)  # BᵀB
    tiny = torch.finfo(z.dtype).eps * float(sigma2[-1].abs()) + torch.finfo(z.dtype).tiny
    to_rows = (v / sigma2.clamp_min(tiny).sqrt()).T @ f_inv  # rows ≈ Uᵀ = to_rows · z
    rows = to_rows @ z
    factor, info = torch.linalg.cholesky_ex(rows @ rows.T)
    if int(info) != 0:
        u, sigma, _ = torch.linalg.svd((f_inv @ z).T, full_matrices=False)
        return u.T, sigma.pow(2)
    q_of_rows = _lower_inverse(factor, eye)  # Q = q_of_rows · rows, QQᵀ = I
    c = q_of_rows @ (rows @ z.T) @ f_inv.T  # QB
    values, w = torch.linalg.eigh(c @ c.T)
    return (w.flip(1).T @ q_of_rows) @ rows, values.flip(0)


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
