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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ... import _rules
from ..._lm.robust import rho
from ..fit_tests import FitTests

__all__ = ["Problem", "Provider", "SmallFit", "solve_small"]

#: The largest condition number of J's scaled columns for which a step is solved from the
#: Gram matrix JᵀJ + λD² (a P × P solve); beyond it from J's QR factor.
GRAM_CONDITION = 1e4

#: SciPy's ``status`` codes and messages, by fit test.
MESSAGES = _rules.STATUS_MESSAGES


class Provider(Protocol):
    @property
    def evaluations(self) -> int: ...

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


@dataclass(frozen=True)
class Problem:
    """One fit as the single-fit drivers take it.

    Arguments:
        provider: the residuals and J of the fit.
        p0: the start, within the bounds.
        lower: the lower bounds.
        upper: the upper bounds.
        tests: the fit tests and the evaluation budget.
    """

    provider: Provider
    p0: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    tests: FitTests


def solve_small(
    problem: Problem,
    *,
    x_scale: np.ndarray | None = None,
    loss: str = "linear",
    f_scale: float = 1.0,
) -> SmallFit:
    """LM from ``p0`` (feasible) until a fit test holds or ``max_nfev`` evaluations.

    Arguments:
        problem: the fit.
        x_scale: the parameters' scales; None: MINPACK's scaling by J's columns.
        loss, f_scale: the robust loss ρ and its scale c.

    Returns:
        The fit.
    """
    lower, upper, tests = problem.lower, problem.upper, problem.tests
    p = np.clip(problem.p0.astype(np.float64), lower, upper)
    run = _Run.started(problem.provider, p, (loss, f_scale), x_scale)
    while True:
        g = run.js.T @ run.rs
        pushing = _rules.held_at_bounds(run.p, lower, upper, g)
        norms, size = _rules.column_norms(run.js), float(np.linalg.norm(run.rs))
        if _rules.gtol_met(g, pushing, norms, size, tests.gtol):
            run.status = 1
            break
        if run.nfev >= tests.max_nfev:
            break
        solve = _damped_solver(run.js[:, ~pushing], run.rs, g, ~pushing, run.d)
        accepted = _attempts(run, solve, g, (lower, upper), tests)
        if accepted:
            run.rejacobian(rescale=x_scale is None)
        if run.status or not accepted:
            break
    return run.fit()


@dataclass
class _Run:
    """One run of the driver: the accepted point, J's scaled rows there, D, λ, the counts."""

    provider: Provider
    loss: str
    f_scale: float
    p: np.ndarray
    r: np.ndarray
    cost: float
    rows: np.ndarray | None
    rs: np.ndarray
    j: np.ndarray
    js: np.ndarray
    d: np.ndarray
    lam: float
    nu: float = _rules.NU_START
    nfev: int = 1
    njev: int = 1
    steps: int = 0
    status: int = 0

    @classmethod
    def started(
        cls,
        provider: Provider,
        p: np.ndarray,
        robust: tuple[str, float],
        x_scale: np.ndarray | None,
    ) -> _Run:
        """The run at the start ``p`` (residuals and J evaluated once), with the loss and
        its scale ``robust``, D from ``x_scale`` or J's columns, and λ's start."""
        loss, f_scale = robust
        r = provider.residuals(p)
        cost, rows, rs = _measure(r, loss, f_scale)
        j = provider.jacobian(p, r)
        js = j if rows is None else j * rows[:, None]
        norms = _rules.column_norms(js)
        d = 1.0 / x_scale if x_scale is not None else _rules.start_scaling(norms)
        lam = float(_rules.start_damping(norms, d))
        return cls(provider, loss, f_scale, p, r, cost, rows, rs, j, js, d, lam)

    def rejacobian(self, rescale: bool) -> None:
        """J at the accepted point, and D's update unless the scales are given."""
        self.j = self.provider.jacobian(self.p, self.r)
        self.njev += 1
        self.js = self.j if self.rows is None else self.j * self.rows[:, None]
        if rescale:
            self.d = _rules.updated_scaling(self.d, _rules.column_norms(self.js))

    def fit(self) -> SmallFit:
        """The fit where the run stopped."""
        return SmallFit(
            params=self.p,
            residuals=self.r,
            jacobian=self.j if self.rows is None else self.j * self.rows[:, None],
            cost=self.cost,
            evaluations=self.nfev,
            jacobians=self.njev,
            steps=self.steps,
            status=self.status,
        )


def _measure(r: np.ndarray, loss: str, c: float) -> tuple[float, np.ndarray | None, np.ndarray]:
    """The cost, J's row scale (None for the linear loss) and the scaled residuals at r."""
    if loss == "linear":
        return 0.5 * float(r @ r), None, r
    return _robust(r, loss, c)


def _damped_solver(
    jf: np.ndarray, rs: np.ndarray, g: np.ndarray, free: np.ndarray, d: np.ndarray
) -> Callable[[float], np.ndarray]:
    """The damped step δ(λ) of J's free columns ``jf`` (zero on the held parameters): from
    the P × P system (JᵀJ + λD²)δ = Jᵀr while J's scaled columns are well conditioned
    (``GRAM_CONDITION``), else from J's thin QR factor, [R; √λ·D] δ = [Qᵀr; 0]."""
    size, width = free.size, int(free.sum())
    gram = jf.T @ jf
    df = d[free]
    eig = np.linalg.eigvalsh(gram / np.outer(df, df))
    if eig[0] > eig[-1] / GRAM_CONDITION**2:

        def from_gram(lam: float) -> np.ndarray:
            delta = np.zeros(size)
            delta[free] = np.linalg.solve(gram + np.diag(lam * df**2), g[free])
            return delta

        return from_gram
    q, rfac = np.linalg.qr(jf)
    rhs = np.concatenate([q.T @ rs, np.zeros(width)])

    def from_qr(lam: float) -> np.ndarray:
        delta = np.zeros(size)
        stacked = np.vstack([rfac, np.diag(np.sqrt(lam) * df)])
        delta[free] = np.linalg.lstsq(stacked, rhs, rcond=None)[0]
        return delta

    return from_qr


def _attempts(
    run: _Run,
    solve: Callable[[float], np.ndarray],
    g: np.ndarray,
    bounds: tuple[np.ndarray, np.ndarray],
    tests: FitTests,
) -> bool:
    """The damped trials of one step: True when one lowers the cost (and moves the run
    there); False when a test stops the fit or the budget ends first."""
    lower, upper = bounds
    while run.nfev < tests.max_nfev:
        trial = np.clip(run.p - solve(run.lam), lower, upper)
        step = trial - run.p
        r_new = run.provider.residuals(trial)
        run.nfev += 1
        run.steps += 1
        if not np.all(np.isfinite(r_new)):
            run.lam, run.nu = _rules.nielsen_reject(run.lam, run.nu)
            continue
        cost_new, rows_new, rs_new = _measure(r_new, run.loss, run.f_scale)
        moved = run.js @ step
        offset = 0.0 if run.loss == "linear" else run.cost - 0.5 * float(run.rs @ run.rs)
        predicted = _rules.predicted_reduction(offset, float(g @ step), float(moved @ moved))
        actual = run.cost - cost_new
        ratio = _rules.gain_ratio(actual, predicted)
        small_step = bool(_rules.xtol_met(run.d, step, run.p, tests.xtol))
        if actual > 0:
            ftol_ok = bool(_rules.ftol_met(actual, run.cost, ratio, tests.ftol))
            run.p, run.r, run.cost, run.rows, run.rs = trial, r_new, cost_new, rows_new, rs_new
            run.lam = _rules.nielsen_accept(run.lam, ratio)
            run.nu = _rules.NU_START
            if ftol_ok or small_step:
                run.status = int(_rules.stop_status(ftol_ok, small_step))
            return True
        run.lam, run.nu = _rules.nielsen_reject(run.lam, run.nu)
        if small_step:
            run.status = 3
            return False
    return False
