"""The small-fit path: LM on the host for one fit of a few parameters, no fixed cost.

For residuals r(p) (N,) and J(p) (N × P) from a provider (``_curve.scipy.providers``), each step
solves the damped problem for each trial λ from the P × P system (JᵀJ + λD²)δ = Jᵀr while
J's scaled columns are well conditioned (``GRAM_CONDITION``); else it takes J's thin QR
factor once, J = QR, and solves the stacked [R; √λ·D] δ = [Qᵀr; 0] (the squared condition
number is never formed). The step's accuracy sets the path, not the solution (the stopping
tests read r and Jᵀr); pcov comes from J's SVD at p̂. D² is MINPACK's scaling: the running maximum of the
column norms² of J (or 1/x_scale² when given). Parameters on a bound whose gradient pushes
outwards are held there for the step (an active set); the trial point is p − δ projected
onto the bounds l ≤ p ≤ u; a step is accepted when it lowers the cost, with Nielsen's (1999)
rule for λ. Stopping follows ``scipy.optimize.least_squares``:

* gtol: ‖g‖∞ < gtol, g = Jᵀr with the components that push against an active bound removed;
* ftol: an accepted step lowered the cost by less than ftol·C with the linear model
  holding (ratio > ¼);
* xtol: ‖DΔp‖ < xtol·(xtol + ‖Dp‖) (MINPACK's scaled form; on rejected trials too).

Robust losses scale J's rows and r as ``least_squares`` does (√(ρ' + 2ρ''z) and ρ'/that).
Everything is float64 NumPy; no host reads but the numbers themselves, no threads. The
rules (λ, D, the fit tests and codes, the robust rows) are ``_rules``'s, which the
batched fits and `NielsenDamping` use too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ... import _rules
from ..._lm.robust import rho
from . import trust

__all__ = ["Provider", "SmallFit", "solve_small"]

#: SciPy's ``status`` codes and messages, by fit test.
MESSAGES = _rules.STATUS_MESSAGES


class Provider(Protocol):
    evaluations: int

    def residuals(self, p: np.ndarray) -> np.ndarray: ...

    def jacobian(self, p: np.ndarray, r: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class SmallFit:
    """p̂, the (unscaled) residuals and J at p̂ (rows scaled for a robust loss, as SciPy's), ½Σc²ρ, evaluations, steps, SciPy's status."""

    params: np.ndarray
    residuals: np.ndarray
    jacobian: np.ndarray
    cost: float
    evaluations: int
    jacobians: int
    steps: int
    status: int

    @property
    def message(self) -> str:
        return MESSAGES[self.status]


def _robust(r: np.ndarray, loss: str, c: float) -> tuple[float, np.ndarray, np.ndarray]:
    """(½Σc²ρ(z), row scale for J, scaled r) at residuals r."""
    z = (r / c) ** 2
    value, first, second = (t.numpy() for t in rho(loss, torch.from_numpy(z)))
    scale, scaled = _rules.robust_scaling(r, z, first, second)
    return 0.5 * c * c * float(value.sum()), scale, scaled


def solve_small(
    provider: Provider,
    p0: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    *,
    ftol: float,
    xtol: float,
    gtol: float,
    max_nfev: int,
    x_scale: np.ndarray | None = None,
    loss: str = "linear",
    f_scale: float = 1.0,
) -> SmallFit:
    """LM from ``p0`` (feasible) until a fit test holds or ``max_nfev`` evaluations."""
    p = np.clip(p0.astype(np.float64), lower, upper)
    linear = loss == "linear"
    r = provider.residuals(p)
    nfev, njev, steps = 1, 0, 0

    def measure(res: np.ndarray) -> tuple[float, np.ndarray | None, np.ndarray]:
        if linear:
            return 0.5 * float(res @ res), None, res
        return _robust(res, loss, f_scale)

    cost, rows, rs = measure(r)
    j = provider.jacobian(p, r)
    njev += 1
    js = j if rows is None else j * rows[:, None]
    d = 1.0 / x_scale if x_scale is not None else _rules.start_scaling(_rules.column_norms(js))
    radius = trust.Radius.start(float(np.linalg.norm(d * p)))
    first, status = True, 0
    while True:
        g = js.T @ rs
        free = ~_rules.held_at_bounds(p, lower, upper, g)
        if cost == 0.0 or trust.cosine_met(js, g, free, float(np.linalg.norm(rs)), gtol):
            status = 1
            break
        if nfev >= max_nfev:
            break
        dec = trust.decompose(js[:, free], d[free], rs, g[free])
        accepted = False
        while nfev < max_nfev and not accepted:
            scaled, radius.lam = trust.step_for_radius(dec, radius.delta, radius.lam)
            delta = np.zeros(p.size)
            delta[free] = scaled / d[free]
            trial = np.clip(p + delta, lower, upper)
            step = trial - p
            length = float(np.linalg.norm(d * step))
            if first:
                radius.delta = min(radius.delta, length)
            r_new = provider.residuals(trial)
            nfev += 1
            steps += 1
            cost_new, rows_new, rs_new = (
                measure(r_new) if np.all(np.isfinite(r_new)) else (np.inf, None, r_new)
            )
            moved = js @ step
            # The model of the (robust) cost's change: −(gᵀs + ½‖J̃s‖²), as SciPy's ``trf``.
            gs = float(g @ step)
            predicted = _rules.predicted_reduction(0.0, gs, float(moved @ moved)) / cost
            actual = _reduction(r, r_new, cost, cost_new) if linear else 1.0 - cost_new / cost
            actual = actual if cost_new < 100.0 * cost else -1.0
            ratio = radius.update(actual, predicted, 0.5 * gs / cost, length)
            if ratio >= trust.ACCEPT:
                p, r, cost, rows, rs = trial, r_new, cost_new, rows_new, rs_new
                accepted, first = True, False
            status = _tests(actual, predicted, ratio, radius.delta, d, p, ftol, xtol)
            if status:
                break
        if status or not accepted:
            if accepted:
                j = provider.jacobian(p, r)
                njev += 1
            break
        j = provider.jacobian(p, r)
        njev += 1
        js = j if rows is None else j * rows[:, None]
        if x_scale is None:
            d = _rules.updated_scaling(d, _rules.column_norms(js))
    return SmallFit(
        params=p,
        residuals=r,
        jacobian=j if rows is None else j * rows[:, None],
        cost=cost,
        evaluations=nfev,
        jacobians=njev,
        steps=steps,
        status=status,
    )


def _reduction(r: np.ndarray, r_new: np.ndarray, cost: float, cost_new: float) -> float:
    """1 − C⁺/C for the linear loss as −Σ(r⁺ − r)(r⁺ + r) / 2C: the difference of the
    residuals is exact where the two costs agree to every digit, so that near p̂ the ratio of
    actual to predicted reduction stays the model's rather than rounding's (1 − C⁺/C loses
    the reduction's digits below ε·C, and with them the radius)."""
    if not np.isfinite(cost_new):
        return -1.0
    return -float((r_new - r) @ (r_new + r)) / (2.0 * cost)


def _tests(
    actual: float,
    predicted: float,
    ratio: float,
    delta: float,
    d: np.ndarray,
    p: np.ndarray,
    ftol: float,
    xtol: float,
) -> int:
    """SciPy's status after a trial by ``lmder``'s ftol and xtol (``trust``), 0 when neither
    holds: ftol on the relative reductions, xtol on the radius Δ against ‖Dp‖."""
    eps = float(np.finfo(np.float64).eps)
    ftol_ok = abs(actual) <= max(ftol, eps) and predicted <= max(ftol, eps) and ratio <= 2.0
    xtol_ok = delta <= max(xtol, eps) * float(np.linalg.norm(d * p))
    if not (ftol_ok or xtol_ok):
        return 0
    return int(_rules.stop_status(ftol_ok, xtol_ok))
