"""SciPy's ``method="lm"`` for one small fit: MINPACK's ``lmder`` on the host.

For residuals r(p) (N,) and J(p) (N × P) from a provider (``_curve.scipy.providers``), each
iteration decomposes the scaled J once and tries steps of the trust region of radius Δ
(``_curve.single_lm.trust``: λ for Δ as ``lmpar`` finds it, Δ's update, ρ ≥ 10⁻⁴ to accept)
until one is accepted; the tests are ``lmder``'s (``trust``'s docstring): ftol on the
relative actual and predicted reductions, xtol on Δ against ‖Dp‖, gtol on the cosine
between r and J's columns. D is MINPACK's scaling: the running maximum of J's column norms
(or 1/x_scale when given). The actual reduction 1 − C⁺/C is taken from the residuals'
difference (``_reduction``), so that near p̂ the ratio ρ, and with it Δ, follows the model
rather than rounding. Parameters on a bound whose gradient pushes outwards are held there
and the trial is projected onto the bounds, as in ``_curve.single_lm.driver``, whose `SmallFit`
this returns.

SciPy's ``"trf"`` and ``"dogbox"`` fits (bounds, robust losses) keep ``single``'s path,
which ``curve_fit_batch`` shares; this one is the default ``"lm"``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import _rules
from . import trust
from .driver import Problem, SmallFit

__all__ = ["solve_lm"]


@dataclass
class _Point:
    """The current point: p, r, C = ½‖r‖²."""

    p: np.ndarray
    r: np.ndarray
    cost: float


def solve_lm(problem: Problem, *, x_scale: np.ndarray | None = None) -> SmallFit:
    """MINPACK's LM from ``p0`` (feasible; the linear loss) until a fit test holds or
    ``max_nfev`` evaluations (module docstring).

    Arguments:
        problem: the fit (the linear loss).
        x_scale: the parameters' scales; None: MINPACK's scaling by J's columns.

    Returns:
        The fit.
    """
    provider, lower, upper, tests = problem.provider, problem.lower, problem.upper, problem.tests
    ftol, xtol, gtol, max_nfev = tests.ftol, tests.xtol, tests.gtol, tests.max_nfev
    p = np.clip(problem.p0.astype(np.float64), lower, upper)
    r = provider.residuals(p)
    at = _Point(p, r, 0.5 * float(r @ r))
    count = {"nfev": 1, "njev": 1, "steps": 0}
    j = provider.jacobian(p, r)
    d = 1.0 / x_scale if x_scale is not None else _rules.start_scaling(_rules.column_norms(j))
    radius = trust.Radius.start(float(np.linalg.norm(d * p)))
    status = 0
    while True:
        g = j.T @ at.r
        free = ~_rules.held_at_bounds(at.p, lower, upper, g)
        size = float(np.linalg.norm(at.r))
        norms = _rules.column_norms(j)
        if at.cost == 0.0 or _rules.gtol_met(g, ~free, norms, size, max(gtol, trust.EPS)):
            status = 1
            break
        if count["nfev"] >= max_nfev:
            break
        dec = trust.decompose(j[:, free], d[free], at.r, g[free])
        accepted = False
        while count["nfev"] < max_nfev and not accepted:
            scaled = np.zeros(p.size)
            scaled[free], radius.lam = trust.step_for_radius(dec, radius.delta, radius.lam)
            trial = np.clip(at.p + scaled / d, lower, upper)
            step = trial - at.p
            length = float(np.linalg.norm(d * step))
            if count["steps"] == 0:
                radius.delta = min(radius.delta, length)
            r_new = provider.residuals(trial)
            count["nfev"] += 1
            count["steps"] += 1
            new = _Point(trial, r_new, 0.5 * float(r_new @ r_new))
            moved = j @ step
            gs = float(g @ step)
            predicted = _rules.predicted_reduction(0.0, gs, float(moved @ moved)) / at.cost
            actual = _reduction(at, new)
            ratio = radius.update(actual, predicted, 0.5 * gs / at.cost, length)
            if ratio >= trust.ACCEPT:
                at, accepted = new, True
            status = _tests(actual, predicted, ratio, radius.delta, d, at.p, (ftol, xtol))
            if status:
                break
        if accepted:
            j = provider.jacobian(at.p, at.r)
            count["njev"] += 1
        if status or not accepted:
            break
        if x_scale is None:
            d = _rules.updated_scaling(d, _rules.column_norms(j))
    return SmallFit(
        params=at.p,
        residuals=at.r,
        jacobian=j,
        cost=at.cost,
        evaluations=count["nfev"],
        jacobians=count["njev"],
        steps=count["steps"],
        status=status,
    )


def _reduction(at: _Point, new: _Point) -> float:
    """1 − C⁺/C as −Σ(r⁺ − r)(r⁺ + r) / 2C: the difference of the residuals is exact where
    the two costs agree to every digit, so that near p̂ the ratio of actual to predicted
    reduction stays the model's rather than rounding's (1 − C⁺/C loses the reduction's
    digits below ε·C, and with them the radius); −1 when C⁺ ≥ 100·C or is not finite."""
    if not np.isfinite(new.cost) or new.cost >= 100.0 * at.cost:
        return -1.0
    return -float((new.r - at.r) @ (new.r + at.r)) / (2.0 * at.cost)


def _tests(
    actual: float,
    predicted: float,
    ratio: float,
    delta: float,
    d: np.ndarray,
    p: np.ndarray,
    tolerances: tuple[float, float],
) -> int:
    """SciPy's status after a trial by ``lmder``'s ftol and xtol (``trust``), 0 when neither
    holds: ftol on the relative reductions, xtol on the radius Δ against ‖Dp‖."""
    eps = float(np.finfo(np.float64).eps)
    ftol, xtol = tolerances
    ftol_ok = abs(actual) <= max(ftol, eps) and predicted <= max(ftol, eps) and ratio <= 2.0
    xtol_ok = delta <= max(xtol, eps) * float(np.linalg.norm(d * p))
    if not (ftol_ok or xtol_ok):
        return 0
    return int(_rules.stop_status(ftol_ok, xtol_ok))
