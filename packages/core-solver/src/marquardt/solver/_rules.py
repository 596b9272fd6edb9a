"""The rules of the small-problem LM, written once for every loop of the package.

Each rule is a function of arrays: torch tensors or NumPy arrays, one fit (vectors of P
parameters, N residuals) or M fits at once (a leading axis M), or plain floats where that
makes sense. The single fit (``_curve.single_lm.driver``), the batched fits (``_curve.batched_lm.driver``) and
`NielsenDamping` (``LMA``'s rule) call them, as SciPy's ``trf`` and ``dogbox`` share
``_lsq/common.py``; a change of rule is a change here.

For residuals r, the row-scaled Jacobian J̃ and r̃ (the robust loss's rows), the cost
C = ½Σc²ρ((r/c)²) and MINPACK's scaling D, one LM iteration solves
(J̃ᵀJ̃ + λD²)δ = g, g = J̃ᵀr̃, and tries p − δ:

* damping (Nielsen 1999; Madsen, Nielsen & Tingleff 2004, §3.2): λ₀ = τ·max_j (‖J_j‖/D_j)²
  with τ = 10⁻³; on acceptance λ ← λ·max(1/3, 1 − (2ρ − 1)³), ν ← 2; on rejection
  λ ← λ·ν, ν ← 2ν, where ρ is the gain ratio (actual over predicted decrease of C);
* scaling (Moré 1978, MINPACK's lmder): D_j = ‖J_j‖ at the start (1 for a zero column),
  then the running maximum D_j ← max(D_j, ‖J_j‖) after each accepted step;
* the fit tests (``scipy.optimize.least_squares``' stopping tests; not `StoppingCriteria`,
  the mean-loss tests of an `LMA` step): gtol when the largest cosine between r̃ and a
  column of J̃ not held at a bound is at most gtol (MINPACK's, or r̃ = 0); ftol when an accepted step lowered C by less than ftol·C
  with ρ > ¼; xtol when ‖DΔp‖ < xtol·(xtol + ‖Dp‖); SciPy's status codes 0-4;
* robust rows (SciPy; Triggs et al. 2000): J's rows scaled by √max(ρ' + 2ρ''z, ε) and
  r̃ = ρ'r / that scale;
* covariance (SciPy's ``curve_fit``): singular values of J at or below ε·max(N, P)·s₀
  count as zero, and pcov = (JᵀJ)⁺·2C/(N − P) unless σ is absolute (inf when N ≤ P).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "NU_START",
    "STATUS_MESSAGES",
    "column_norms",
    "covariance_scale",
    "ftol_met",
    "gain_ratio",
    "gtol_met",
    "held_at_bounds",
    "nielsen_accept",
    "nielsen_reject",
    "predicted_reduction",
    "pseudo_inverse_gram",
    "robust_scaling",
    "singular_cut",
    "start_damping",
    "start_scaling",
    "stop_status",
    "updated_scaling",
    "xtol_met",
]

#: A torch tensor, a NumPy array or a float: each rule returns the kind it was given.
A = Any

#: τ of the starting damping λ₀ = τ·max_j (‖J_j‖/D_j)² (Nielsen 1999).
START_FACTOR = 1e-3
#: ν after an accepted step (and at the start).
NU_START = 2.0
#: The smallest factor λ is multiplied by after an accepted step.
SHRINK_MIN = 1.0 / 3.0
#: ρ above which an accepted step with a small decrease meets ftol (the linear model held).
FTOL_RATIO = 0.25

#: SciPy's ``least_squares`` status codes and messages, by fit test.
STATUS_MESSAGES = {
    0: "The maximum number of function evaluations is exceeded.",
    1: "`gtol` termination condition is satisfied.",
    2: "`ftol` termination condition is satisfied.",
    3: "`xtol` termination condition is satisfied.",
    4: "Both `ftol` and `xtol` termination conditions are satisfied.",
}


def _torch(a: Any, b: Any) -> bool:
    return isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)


def _where(condition: Any, a: Any, b: Any) -> Any:
    if isinstance(condition, torch.Tensor):
        return torch.where(condition, a, b)
    return np.where(condition, a, b)


def _norm(a: Any) -> Any:
    """Euclidean norm over the last axis."""
    if isinstance(a, torch.Tensor):
        return torch.linalg.vector_norm(a, dim=-1)
    return np.sqrt((a * a).sum(-1))


def nielsen_accept(lam: A, ratio: A) -> A:
    """λ after an accepted step of gain ratio ρ: λ·max(1/3, 1 − (2ρ − 1)³) (ν becomes 2)."""
    shrink = 1.0 - (2.0 * ratio - 1.0) ** 3
    if isinstance(shrink, torch.Tensor):
        return lam * torch.clamp(shrink, min=SHRINK_MIN)
    if isinstance(shrink, np.ndarray):
        return lam * np.maximum(shrink, SHRINK_MIN)
    return lam * max(SHRINK_MIN, shrink)


def nielsen_reject(lam: A, nu: A) -> tuple[A, A]:
    """(λ, ν) after a rejected step: (λ·ν, 2ν)."""
    return lam * nu, 2.0 * nu


def predicted_reduction(offset: A, gs: A, curvature: A) -> A:
    """The linear model's reduction of the cost at a step s, C − ½‖r̃ + J̃s‖², written
    (C − ½‖r̃‖²) − gᵀs − ½‖J̃s‖² with g = J̃ᵀr̃ as SciPy's ``least_squares`` forms it: the
    offset is 0 for the linear loss, and no difference of two near-equal costs is taken.

    **Arguments:**

    - ``offset``: C − ½‖r̃‖² (0 for the linear loss); ``gs``: gᵀs; ``curvature``: ‖J̃s‖².

    **Returns:** the predicted reduction.
    """
    return offset - gs - 0.5 * curvature


def gain_ratio(actual: A, predicted: A) -> A:
    """ρ = actual / predicted decrease; ±1 by the sign of the actual one when the
    prediction is not positive (SciPy's ``least_squares`` reads it so). `LMA`'s report
    keeps NaN there instead (``_lm.damping.base.reported_gain_ratio``); its rule accepts only ρ > 0."""
    if isinstance(actual, (float, int)) and isinstance(predicted, (float, int)):
        if predicted > 0:
            return actual / predicted
        return 1.0 if actual > 0 else -1.0
    if isinstance(actual, torch.Tensor):
        # The quotient where the prediction is not positive is discarded by the where.
        sign = torch.where(actual > 0, 1.0, -1.0).to(actual.dtype)
        return torch.where(predicted > 0, actual / predicted, sign)
    positive = np.asarray(predicted) > 0
    quotient = np.asarray(actual) / np.where(positive, predicted, 1.0)
    return np.where(positive, quotient, np.where(np.asarray(actual) > 0, 1.0, -1.0))


def column_norms(js: A) -> A:
    """‖J_j‖ of each column (over the rows, the second-to-last axis)."""
    if isinstance(js, torch.Tensor):
        return torch.sqrt((js * js).sum(-2))
    return np.sqrt(np.einsum("...ij,...ij->...j", js, js))


def start_scaling(norms: A) -> A:
    """MINPACK's D at the start: the column norms, 1 for a zero column."""
    return _where(
        norms > 0, norms, 1.0 if not isinstance(norms, torch.Tensor) else torch.ones_like(norms)
    )


def updated_scaling(d: A, norms: A) -> A:
    """MINPACK's running maximum D ← max(D, ‖J_j‖) after an accepted step."""
    if isinstance(d, torch.Tensor):
        return torch.maximum(d, norms)
    return np.maximum(d, norms)


def start_damping(norms: A, d: A) -> A:
    """λ₀ = τ·max_j (‖J_j‖/D_j)² per fit (0 without parameters)."""
    ratio = (norms / d) ** 2
    if isinstance(ratio, torch.Tensor):
        if ratio.shape[-1] == 0:
            return torch.zeros(ratio.shape[:-1], dtype=ratio.dtype, device=ratio.device)
        return START_FACTOR * ratio.amax(-1)
    return START_FACTOR * ratio.max(-1, initial=0.0)


def held_at_bounds(p: A, lower: A, upper: A, g: A) -> A:
    """The parameters on a bound whose gradient g = J̃ᵀr̃ pushes outwards (the step −δ
    follows −g): held there for the step."""
    return ((p <= lower) & (g > 0)) | ((p >= upper) & (g < 0))


def gtol_met(g: A, held: A, norms: A, size: A, gtol: float) -> A:
    """MINPACK's gtol: the largest cosine between r̃ and a column of J̃,
    |g_j| / (‖r̃‖·‖J̃_j‖) over the parameters not held and the columns of nonzero norm, at
    most gtol, or r̃ = 0. Scale-free: a fit whose residuals are small (a zero-residual
    problem) is not stopped by its small gradient.

    **Arguments:**

    - ``g``: J̃ᵀr̃; ``held``: the parameters held at a bound; ``norms``: ‖J̃_j‖ (each of
      the last axis); ``size``: ‖r̃‖ (one per fit); ``gtol``: the tolerance.

    **Returns:** whether the test holds (one per fit).
    """
    if isinstance(g, torch.Tensor):
        usable = ~held & (norms > 0)
        denominator = torch.where(usable, size[..., None] * norms, torch.ones_like(norms))
        cosine = torch.where(usable, g.abs() / denominator, torch.zeros_like(norms))
        largest = cosine.amax(-1) if cosine.shape[-1] else torch.zeros_like(size)
        return (largest <= gtol) | (size == 0)
    free = ~np.asarray(held) & (norms > 0)
    scale = np.where(free, np.asarray(size)[..., None] * norms, 1.0)
    most = np.where(free, np.abs(g) / scale, 0.0).max(-1, initial=0.0)
    return (most <= gtol) | (size == 0)


def ftol_met(actual: A, cost: A, ratio: A, ftol: float) -> A:
    """An accepted step's decrease of C below ftol·C with the linear model holding."""
    return (actual < ftol * cost) & (ratio > FTOL_RATIO)


def xtol_met(d: A, step: A, p: A, xtol: float) -> A:
    """‖DΔp‖ < xtol·(xtol + ‖Dp‖) (MINPACK's scaled form)."""
    return _norm(d * step) < xtol * (xtol + _norm(d * p))


def stop_status(ftol_ok: A, xtol_ok: A) -> A:
    """SciPy's status for a stop on ftol and/or xtol: 4 both, 2 ftol, 3 xtol."""
    if _torch(ftol_ok, xtol_ok):
        return torch.where(ftol_ok & xtol_ok, 4, torch.where(ftol_ok, 2, 3))
    if isinstance(ftol_ok, (bool, np.bool_)) and isinstance(xtol_ok, (bool, np.bool_)):
        return 4 if ftol_ok and xtol_ok else (2 if ftol_ok else 3)
    return np.where(ftol_ok & xtol_ok, 4, np.where(ftol_ok, 2, 3))


def robust_scaling(r: A, z: A, first: A, second: A) -> tuple[A, A]:
    """(row scale of J, scaled r) from ρ'(z) and ρ''(z) at residuals r, z = (r/c)²:
    √max(ρ' + 2ρ''z, ε) and ρ'r / that scale (SciPy's ``scale_for_robust_loss_function``)."""
    curvature = first + 2.0 * second * z
    if isinstance(curvature, torch.Tensor):
        scale = torch.sqrt(torch.clamp(curvature, min=torch.finfo(curvature.dtype).eps))
    else:
        scale = np.sqrt(np.maximum(curvature, np.finfo(np.float64).eps))
    return scale, r * first / scale


def singular_cut(largest: A, rows: Any, params: int, eps: float) -> A:
    """The singular value of J at or below which it counts as zero: ε·max(N, P)·s₀."""
    if isinstance(rows, torch.Tensor):
        return eps * torch.clamp(rows, min=params) * largest
    return eps * max(rows, params) * largest


def covariance_scale(cost2: A, rows: Any, params: int) -> A:
    """s² = 2C/(N − P) of a covariance whose σ are relative; inf when N ≤ P."""
    if isinstance(rows, torch.Tensor):
        dof = rows - params
        return torch.where(dof > 0, cost2 / torch.clamp(dof, min=1.0), torch.inf)
    return cost2 / (rows - params) if rows > params else float("inf")


def pseudo_inverse_gram(s: A, vt: A, rows: Any, eps: float) -> A:
    """(JᵀJ)⁺ = V·diag(1/s²)·Vᵀ over J's singular values above `singular_cut` (SciPy's
    ``curve_fit``), from J's (or R's) SVD: ``s`` (..., k) descending and ``vt`` (..., k, P),
    one fit or M fits; ``rows`` is N (a number, or one per fit)."""
    params = vt.shape[-1]
    if isinstance(s, torch.Tensor):
        n = rows[..., None] if isinstance(rows, torch.Tensor) else rows
        keep = s > singular_cut(s[..., :1], n, params, eps)
        weights = torch.where(keep, 1.0 / torch.where(keep, s, torch.ones_like(s)) ** 2, 0.0)
        return torch.einsum("...kp,...k,...kq->...pq", vt, weights, vt)
    kept = s > singular_cut(s[..., :1], rows, params, eps)
    inverse = np.where(kept, 1.0 / np.where(kept, s, 1.0) ** 2, 0.0)
    return np.einsum("...kp,...k,...kq->...pq", vt, inverse, vt)
