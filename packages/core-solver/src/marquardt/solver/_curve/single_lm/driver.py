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

* gtol: MINPACK's cosine |g_j| / (‖r‖·‖J_j‖) ≤ gtol, g = Jᵀr, over the components that do
  not push against an active bound (``_rules.gtol_met``);
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

__all__ = ["Provider", "SmallFit", "solve_small"]

#: The largest condition number of J's scaled columns for which a step is solved from the
#: Gram matrix JᵀJ + λD² (a P × P solve); beyond it from J's QR factor.
GRAM_CONDITION = 1e4

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
    norms = _rules.column_norms(js)
    d = 1.0 / x_scale if x_scale is not None else _rules.start_scaling(norms)
    lam = float(_rules.start_damping(norms, d))
    nu = _rules.NU_START
    status = 0
    size = p.size
    while True:
        g = js.T @ rs
        pushing = _rules.held_at_bounds(p, lower, upper, g)
        if _rules.gtol_met(g, pushing, _rules.column_norms(js), float(np.linalg.norm(rs)), gtol):
            status = 1
            break
        if nfev >= max_nfev:
            break
        free = ~pushing
        width = int(free.sum())
        jf = js[:, free]
        gram = jf.T @ jf
        scaled = gram / np.outer(d[free], d[free])
        eig = np.linalg.eigvalsh(scaled)
        use_gram = eig[0] > eig[-1] / GRAM_CONDITION**2
        if not use_gram:
            q, rfac = np.linalg.qr(jf)
            qtr = q.T @ rs
        accepted = False
        while nfev < max_nfev:
            delta = np.zeros(size)
            if use_gram:
                delta[free] = np.linalg.solve(gram + np.diag(lam * d[free] ** 2), g[free])
            else:
                stacked = np.vstack([rfac, np.diag(np.sqrt(lam) * d[free])])
                delta[free] = np.linalg.lstsq(
                    stacked, np.concatenate([qtr, np.zeros(width)]), rcond=None
                )[0]
            trial = np.clip(p - delta, lower, upper)
            step = trial - p
            r_new = provider.residuals(trial)
            nfev += 1
            steps += 1
            if not np.all(np.isfinite(r_new)):
                lam, nu = _rules.nielsen_reject(lam, nu)
                continue
            cost_new, rows_new, rs_new = measure(r_new)
            moved = js @ step
            offset = 0.0 if linear else cost - 0.5 * float(rs @ rs)
            predicted = _rules.predicted_reduction(offset, float(g @ step), float(moved @ moved))
            actual = cost - cost_new
            ratio = _rules.gain_ratio(actual, predicted)
            small_step = bool(_rules.xtol_met(d, step, p, xtol))
            if actual > 0:
                ftol_ok = bool(_rules.ftol_met(actual, cost, ratio, ftol))
                p, r, cost, rows, rs = trial, r_new, cost_new, rows_new, rs_new
                lam = _rules.nielsen_accept(lam, ratio)
                nu = _rules.NU_START
                accepted = True
                if ftol_ok or small_step:
                    status = int(_rules.stop_status(ftol_ok, small_step))
                break
            lam, nu = _rules.nielsen_reject(lam, nu)
            if small_step:
                status = 3
                break
        if accepted:
            j = provider.jacobian(p, r)
            njev += 1
            js = j if rows is None else j * rows[:, None]
            if x_scale is None:
                d = _rules.updated_scaling(d, _rules.column_norms(js))
        if status or not accepted:
            break
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
