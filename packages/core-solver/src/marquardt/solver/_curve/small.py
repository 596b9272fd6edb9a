"""The small-fit path: LM on the host for one fit of a few parameters, no fixed cost.

For residuals r(p) (N,) and J(p) (N × P) from a provider (``_curve.providers``), each step
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
Everything is float64 NumPy; no host reads but the numbers themselves, no threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .._lm.robust import rho

__all__ = ["Provider", "SmallFit", "solve_small"]

_EPS = float(np.finfo(np.float64).eps)
#: The largest condition number of J's scaled columns for which a step is solved from the
#: Gram matrix JᵀJ + λD² (a P × P solve); beyond it from J's QR factor.
GRAM_CONDITION = 1e4

#: SciPy's ``status`` codes and messages, by stopping test.
MESSAGES = {
    0: "The maximum number of function evaluations is exceeded.",
    1: "`gtol` termination condition is satisfied.",
    2: "`ftol` termination condition is satisfied.",
    3: "`xtol` termination condition is satisfied.",
    4: "Both `ftol` and `xtol` termination conditions are satisfied.",
}


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
    z = torch.from_numpy((r / c) ** 2)
    value, first, second = (t.numpy() for t in rho(loss, z))
    scale = np.sqrt(np.maximum(first + 2.0 * second * z.numpy(), _EPS))
    return 0.5 * c * c * float(value.sum()), scale, r * first / scale


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
    """LM from ``p0`` (feasible) until a stopping test holds or ``max_nfev`` evaluations."""
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
    norms = np.sqrt(np.einsum("ij,ij->j", js, js))
    d = 1.0 / x_scale if x_scale is not None else np.where(norms > 0, norms, 1.0)
    lam = 1e-3 * float(np.max((norms / d) ** 2)) if norms.size else 0.0
    nu = 2.0
    status = 0
    size = p.size
    while True:
        g = js.T @ rs
        pushing = ((p <= lower) & (g > 0)) | ((p >= upper) & (g < 0))
        if np.max(np.abs(np.where(pushing, 0.0, g)), initial=0.0) < gtol or cost == 0.0:
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
                lam *= nu
                nu *= 2.0
                continue
            cost_new, rows_new, rs_new = measure(r_new)
            model = rs + js @ step
            predicted = cost - 0.5 * float(model @ model)
            actual = cost - cost_new
            ratio = actual / predicted if predicted > 0 else (1.0 if actual > 0 else -1.0)
            small_step = np.linalg.norm(d * step) < xtol * (xtol + np.linalg.norm(d * p))
            if actual > 0:
                ftol_ok = actual < ftol * cost and ratio > 0.25
                p, r, cost, rows, rs = trial, r_new, cost_new, rows_new, rs_new
                lam *= max(1.0 / 3.0, 1.0 - (2.0 * ratio - 1.0) ** 3)
                nu = 2.0
                accepted = True
                if ftol_ok or small_step:
                    status = 4 if ftol_ok and small_step else (2 if ftol_ok else 3)
                break
            lam *= nu
            nu *= 2.0
            if small_step:
                status = 3
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
            d = np.maximum(d, np.sqrt(np.einsum("ij,ij->j", js, js)))
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
