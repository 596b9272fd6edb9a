"""MINPACK's trust region for one small fit: the damped step, the radius, the fit tests.

``lmder`` (Moré 1978; Moré, Garbow & Hillstrom 1980), the routine behind SciPy's
``method="lm"``, does not choose the damping λ by a rule of its own: it keeps a radius Δ
of the scaled step ‖Dδ‖ and finds the λ whose step has that length (``lmpar``), the
Gauss-Newton step itself (λ = 0) when that step is short enough. Here the step comes from
the singular values and vectors of the scaled Jacobian A = J·D⁻¹ = UΣVᵀ: with b = Uᵀr,
the scaled step of damping λ is

    z(λ) = −Σ_i σ_i b_i / (σ_i² + λ) v_i,    δ = D⁻¹z,

O(P) for each trial λ once A is decomposed. While A's condition number is at most
``GRAM_CONDITION`` σ², V and σb = VᵀAᵀr come from the eigenvectors of AᵀA (a P × P
problem, the cost of the Gram solve); beyond it from the SVD of A's triangular factor
R (A = QR, MINPACK's route, with Qᵀr from the factor of [A | r]), as accurate as the QR of
[A; √λ·I]: JᵀJ's squared condition number is never used there. Singular values at or
below ε·max(N, P)·σ₀ count as zero (the rank-deficient least-squares step, as ``lmpar``
takes from R's zero diagonal). λ is found as ``lmpar`` finds it: Newton's iteration on
1/Δ − 1/‖z(λ)‖ from the last λ, safeguarded between bounds, until ‖z‖ is within 10% of Δ
(at most ten tries).

The radius and the tests are ``lmder``'s, in the terms of the cost C = ½‖r‖²: the relative
actual reduction 1 − C⁺/C (−1 when C⁺ ≥ 100·C), the relative predicted one (the damped
linear model's), their ratio ρ; Δ shrinks when ρ ≤ ¼ and doubles ‖Dδ‖ when ρ ≥ ¾ or the
step was Gauss-Newton's; a trial is accepted when ρ ≥ 10⁻⁴. The fit tests:

* ftol: both reductions at most ftol and ρ ≤ 2;
* xtol: Δ ≤ xtol·‖Dp‖;
* gtol: the largest cosine between r and a column of J, |J_jᵀr| / (‖r‖·‖J_j‖), at most gtol;

and each also when its quantity reaches ε (MINPACK's "tolerance too small" ends, reported
here as the test they extend).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EPS",
    "FACTOR",
    "GRAM_CONDITION",
    "Decomposition",
    "Radius",
    "decompose",
    "step_for_radius",
]

#: Δ₀ = FACTOR·‖Dp₀‖ (MINPACK's ``factor``, SciPy's 100).
FACTOR = 100.0
#: The trust region's acceptance ratio: a trial is taken when ρ ≥ ACCEPT.
ACCEPT = 1e-4
#: The largest condition number of the scaled J whose step is taken from AᵀA's eigenvalues.
GRAM_CONDITION = 1e4
#: ``lmpar``'s relative tolerance on ‖z‖ − Δ, and its most tries.
_LENGTH_TOLERANCE = 0.1
_TRIES = 10
#: float64's machine epsilon: each fit test also holds once its quantity reaches it.
EPS = float(np.finfo(np.float64).eps)
_TINY = float(np.finfo(np.float64).tiny)


@dataclass(frozen=True)
class Decomposition:
    """The scaled Jacobian's singular values and vectors, kept for the trials at one point:
    σ² and c = σ·b (b = Uᵀr) of the kept singular values, as Python floats (P is small:
    a trial's λ costs no array operation), and V's columns on them (k × rank)."""

    s2: tuple[float, ...]
    c: tuple[float, ...]
    v: np.ndarray
    full_rank: bool

    @classmethod
    def of(cls, sigma: np.ndarray, b: np.ndarray, v: np.ndarray, full_rank: bool) -> Decomposition:
        return cls(tuple((sigma**2).tolist()), tuple((sigma * b).tolist()), v, full_rank)

    def scaled_step(self, lam: float) -> np.ndarray:
        """z(λ) = −Σ σ_i b_i / (σ_i² + λ) v_i."""
        weights = np.array([c / (s2 + lam) for s2, c in zip(self.s2, self.c, strict=True)])
        return np.asarray(-(self.v @ weights))

    def length(self, lam: float) -> tuple[float, float]:
        """(‖z(λ)‖, d‖z‖/dλ)."""
        norm2 = slope = 0.0
        for s2, c in zip(self.s2, self.c, strict=True):
            q = c / (s2 + lam)
            norm2 += q * q
            slope += q * q / (s2 + lam)
        if norm2 == 0.0:
            return 0.0, 0.0
        norm = math.sqrt(norm2)
        return norm, -slope / norm


def decompose(js: np.ndarray, d: np.ndarray, r: np.ndarray, g: np.ndarray) -> Decomposition:
    """σ, b = Uᵀr and V of A = J·D⁻¹ (N × k), given J (``js``), D, r and g = Jᵀr: from the
    eigenvalues of AᵀA (σ²) while A's condition number is at most ``GRAM_CONDITION``,
    where AᵀA loses none of the digits the step needs; else from the SVD of R, A's
    triangular factor, with Qᵀr taken from the factor of [A | r] (MINPACK's route: JᵀJ's
    squared condition number never formed). The singular values at or below
    ε·max(N, k)·σ₀ are dropped."""
    rows, size = js.shape
    if size == 0:
        empty = np.zeros(0)
        return Decomposition.of(empty, empty, np.zeros((0, 0)), True)
    w, v = np.linalg.eigh((js.T @ js) / np.outer(d, d))
    if w[0] > w[-1] / GRAM_CONDITION**2:
        sigma = np.sqrt(w[::-1])
        v = v[:, ::-1]
        return Decomposition.of(sigma, (v.T @ (g / d)) / sigma, v, True)
    scaled = js / d
    if rows > size:
        factor = np.asarray(np.linalg.qr(np.column_stack([scaled, r]), mode="r"))
        u, s, vt = np.linalg.svd(factor[:size, :size])
        b = u.T @ factor[:size, size]
    else:
        u, s, vt = np.linalg.svd(scaled, full_matrices=False)
        b = u.T @ r
    keep = s > EPS * max(rows, size) * s[0]
    return Decomposition.of(s[keep], b[keep], vt[keep].T, bool(keep.all()))


def step_for_radius(dec: Decomposition, radius: float, lam: float) -> tuple[np.ndarray, float]:
    """(z, λ): the Gauss-Newton step when ‖z(0)‖ ≤ 1.1·Δ (λ = 0), else the damped step with
    ‖z(λ)‖ within 10% of Δ, λ found from the last one (``lmpar``, module docstring)."""
    length, slope = dec.length(0.0)
    if length - radius <= _LENGTH_TOLERANCE * radius:
        return dec.scaled_step(0.0), 0.0
    phi = length - radius
    # Newton's bound from λ = 0 when A has full rank: ‖z‖ is convex in 1/… there.
    low = (phi / radius) * length / -slope if dec.full_rank and slope < 0 else 0.0
    gradient = math.sqrt(sum(c * c for c in dec.c))
    high = gradient / radius if gradient > 0 else _TINY / min(radius, 0.1)
    lam = min(max(lam, low), high)
    if lam == 0.0:
        lam = gradient / length
    for _ in range(_TRIES):
        if lam == 0.0:
            lam = max(_TINY, 1e-3 * high)
        length, slope = dec.length(lam)
        previous, phi = phi, length - radius
        # Within 10%, or (rank-deficient A) too short and not growing from the last try.
        if abs(phi) <= _LENGTH_TOLERANCE * radius or (low == 0.0 and phi <= previous < 0.0):
            break
        if phi > 0:
            low = max(low, lam)
        else:
            high = min(high, lam)
        correction = (length / radius) * phi / -slope if slope < 0 else 0.0
        lam = max(low, lam + correction)
    return dec.scaled_step(lam), lam


@dataclass
class Radius:
    """Δ and λ of one fit between trials (``lmder``'s update, module docstring)."""

    delta: float
    lam: float = 0.0

    @classmethod
    def start(cls, scaled_norm: float) -> Radius:
        """Δ₀ = FACTOR·‖Dp₀‖, or FACTOR when that is 0."""
        return cls(FACTOR * scaled_norm if scaled_norm > 0 else FACTOR)

    def update(self, actual: float, predicted: float, derivative: float, length: float) -> float:
        """Δ and λ after a trial of scaled length ‖Dδ‖ = ``length``, from the relative
        actual and predicted reductions and the relative directional derivative
        gᵀδ/(2C); returns ρ."""
        ratio = actual / predicted if predicted != 0 else 0.0
        if ratio <= 0.25:
            shrink = 0.5
            if actual < 0:
                shrink = 0.5 * derivative / (derivative + 0.5 * actual)
            if actual <= -1.0 or shrink < 0.1:
                shrink = 0.1
            self.delta = shrink * min(self.delta, length / 0.1)
            self.lam = self.lam / shrink
        elif self.lam == 0.0 or ratio >= 0.75:
            self.delta = length / 0.5
            self.lam = 0.5 * self.lam
        return ratio
