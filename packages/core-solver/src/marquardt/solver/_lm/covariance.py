"""Parameter covariance of a least-squares fit: pcov = s²·(JᵀJ)⁻¹, computed stably.

For weighted residuals r (N rows) with Jacobian J (N × P) at the optimum, the asymptotic
covariance of the parameters is (JᵀJ)⁻¹ scaled by s² (Seber & Wild 1989, §2.1; Press et
al., Numerical Recipes §15.5), with SciPy's ``curve_fit`` conventions:

* ``absolute_sigma=False``: s² = 2C/(N − P), the reduced chi-square (2C = Σr² for the
  linear loss); the covariance does not depend on the scale of σ;
* ``absolute_sigma=True``: s² = 1, σ are taken as absolute standard deviations.

(JᵀJ)⁻¹ is never formed by inverting JᵀJ, whose condition number is κ(J)²: J is reduced
slice by slice to its triangular factor R (J = QR; the tall-skinny QR of Demmel et al. 2012,
R ← qr([R; J_s]).R), so only P × P is ever held besides one slice, and R = UΣVᵀ gives
(JᵀJ)⁻¹ = V Σ⁻² Vᵀ, as SciPy computes it from the SVD of J. R may also come from the
Cholesky factor of the Gram matrix JᵀJ (``factor_from_gram``), but only while J's scaled
columns have a condition number small enough for its ε·κ² error. Singular values at or below
ε·max(N, P)·σ₁ (SciPy's threshold) count as zero; a J of lower rank than P, or N ≤ P
without ``absolute_sigma``, leaves the covariance undetermined: every entry is inf and a
`CovarianceWarning` is issued (SciPy's ``curve_fit`` does the same for
``method="lm"``; its "trf" returns a pseudo-inverse instead).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from marquardt.jacobian import JacobianEngine

from .._errors import CovarianceWarning, user_stacklevel
from .._rules import covariance_scale, pseudo_inverse_gram, singular_cut
from .batch import check_batch

__all__ = [
    "Covariance",
    "GramFactor",
    "TriangularFactor",
    "batch_covariance",
    "covariance_from_factor",
    "factor_from_gram",
    "triangular_factor",
]


@dataclass(frozen=True)
class Covariance:
    """pcov (P × P, float64, CPU), the rank of J, and its singular values (descending)."""

    pcov: torch.Tensor
    rank: int
    singular_values: torch.Tensor

    @property
    def standard_errors(self) -> torch.Tensor:
        """√diag(pcov)."""
        return torch.sqrt(torch.diagonal(self.pcov))


class TriangularFactor:
    """R of a tall matrix given block by block (RᵀR = MᵀM; float64 on the CPU).

    Each block is reduced into R as it arrives, R ← qr([R; M_s]).R, and then freed.
    """

    def __init__(self) -> None:
        self.factor: torch.Tensor | None = None
        self.rows = 0

    def add(self, block: torch.Tensor) -> None:
        m = block.detach().to("cpu", torch.float64)
        self.rows += int(m.shape[0])
        stacked = m if self.factor is None else torch.cat([self.factor, m])
        self.factor = torch.linalg.qr(stacked, mode="r").R


class GramFactor:
    """R of a tall matrix given block by block, from its Gram matrix MᵀM (float64, on the
    blocks' device), when that is accurate enough; see `factor`.

    Forming MᵀM costs a matrix product per block where the QR of ``TriangularFactor``
    costs a Householder sweep, but squares the condition number: R from the Cholesky
    factor of the Gram matrix has a relative error of about ε·κ², against ε·κ from QR.
    """

    def __init__(self) -> None:
        self.gram: torch.Tensor | None = None
        self.rows = 0

    def add(self, rows: torch.Tensor) -> None:
        """Add the block whose *transpose* is ``rows`` ((P+1) × b: one row per column)."""
        m = rows.detach().to(torch.float64)
        self.rows += int(m.shape[1])
        if self.gram is None:
            self.gram = m @ m.T
        else:
            self.gram.addmm_(m, m.T)

    def factor(self, condition: float) -> torch.Tensor | None:
        """`factor_from_gram` of the blocks given so far."""
        return None if self.gram is None else factor_from_gram(self.gram, condition)


def factor_from_gram(gram: torch.Tensor, condition: float) -> torch.Tensor | None:
    """R with RᵀR = ``gram`` (= MᵀM; on the CPU, float64), or None when M's columns,
    scaled to unit norm, have a condition number above ``condition`` (or are singular):
    then ε·κ² is too coarse, and the caller reduces M by QR instead."""
    gram = gram.to("cpu", torch.float64)
    norms = torch.sqrt(torch.diagonal(gram))
    if not bool((norms > 0).all()) or not bool(torch.isfinite(gram).all()):
        return None
    scaled = gram / norms.unsqueeze(0) / norms.unsqueeze(1)
    lower, info = torch.linalg.cholesky_ex(scaled)
    if int(info) != 0:
        return None
    sv = torch.linalg.svdvals(lower)
    if not float(sv[0]) <= condition * float(sv[-1]):
        return None
    factor: torch.Tensor = lower.T * norms.unsqueeze(0)
    return factor


def triangular_factor(blocks: Iterable[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(R, rows) of the matrix stacked from ``blocks`` (see `TriangularFactor`)."""
    acc = TriangularFactor()
    for block in blocks:
        acc.add(block)
    if acc.factor is None:
        raise ValueError("triangular_factor got no rows. HINT: pass a non-empty batch.")
    return acc.factor, acc.rows


def covariance_from_factor(
    factor: torch.Tensor, rows: int, cost2: float, *, absolute_sigma: bool
) -> Covariance:
    """The covariance from R (RᵀR = JᵀJ), N = ``rows`` and 2C = ``cost2`` (Σr² when linear)."""
    params = int(factor.shape[1])
    _, sv, vt = torch.linalg.svd(factor, full_matrices=False)
    # Fewer rows than parameters: the missing singular values are zero.
    singular = torch.cat([sv, torch.zeros(params - sv.numel(), dtype=sv.dtype)])
    top = float(sv[0]) if sv.numel() else 0.0
    threshold = singular_cut(top, rows, params, torch.finfo(torch.float64).eps)
    rank = int((sv > threshold).sum()) if top > 0.0 else 0
    undetermined = rank < params or (not absolute_sigma and rows <= params)
    if undetermined:
        why = (
            f"the Jacobian has rank {rank} < {params} parameters"
            if rank < params
            else f"there are {rows} residuals for {params} parameters (N ≤ P)"
        )
        warnings.warn(
            f"the covariance of the parameters could not be estimated: {why}; every entry "
            "is inf. HINT: fix or drop parameters the data do not determine, or pass "
            "absolute_sigma=True with known σ",
            CovarianceWarning,
            stacklevel=user_stacklevel(),
        )
        pcov = torch.full((params, params), float("inf"), dtype=torch.float64)
        return Covariance(pcov=pcov, rank=rank, singular_values=singular)
    pcov = pseudo_inverse_gram(sv, vt, rows, torch.finfo(torch.float64).eps)
    pcov = 0.5 * (pcov + pcov.T)  # exactly symmetric, as a covariance is
    if not absolute_sigma:
        pcov = pcov * covariance_scale(cost2, rows, params)
    return Covariance(pcov=pcov, rank=rank, singular_values=singular)


def batch_covariance(
    engine: JacobianEngine,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    slice_size: int | None,
    *,
    absolute_sigma: bool,
) -> Covariance:
    """The covariance at the engine's current parameters on one batch (2C = Σr²).

    The batch is checked first (`check_batch`, against the engine's replicas). J comes
    slice by slice from the engine (its residual rows and the flat parameters of its model,
    in ``model.parameters()`` order) and is reduced as it arrives.
    """
    replicas = engine.replicas
    inputs, targets, slice_size = check_batch(
        inputs, targets, slice_size, dtype=replicas.dtype, home=replicas.devices
    )
    reduced = TriangularFactor()
    rss = 0.0
    for piece in engine.slices(inputs, targets, slice_size):
        r = piece.residuals.detach().to(torch.float64)
        rss += float(r @ r)
        reduced.add(piece.jacobian)
    assert reduced.factor is not None  # the engine refuses an empty batch
    return covariance_from_factor(reduced.factor, reduced.rows, rss, absolute_sigma=absolute_sigma)
