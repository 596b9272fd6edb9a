"""One LM over M independent small fits at once: per-fit λ, scaling, bounds and stopping.

Each fit m has residuals r_m(p) = w_m ⊙ (f(x_m, p) − y_m) (N points, zero where its mask
drops a point) and its own state: p, λ, ν, the scaling D (MINPACK's running maximum of
J's column norms), evaluations, steps and status. One iteration does, for every fit still
running, what one trial of the small-fit path (``_curve.single_lm.driver``) does for one fit:

* g = Jᵀr̃; parameters on a bound whose gradient pushes outwards are held (the active
  set); gtol: the largest cosine between r̃ and a column of J̃ over the others at most
  gtol, or r̃ = 0 (``_rules.gtol_met``);
* the damped step from the scaled P × P system (D⁻¹JᵀJD⁻¹ + λI)u = D⁻¹g, δ = D⁻¹u, by a
  batched Cholesky factorisation (``torch.linalg.cholesky_ex``); a fit whose factorisation
  fails takes no trial this iteration and raises λ (λ ← νλ, ν ← 2ν) instead;
* the trial p − δ projected onto l ≤ p ≤ u, its residuals and Jacobian in one forward-mode
  pass; accepted when it lowers the cost, with Nielsen's (1999) rule for λ; ftol and xtol
  as ``scipy.optimize.least_squares`` tests them.

Robust losses scale J's rows and r as SciPy does (√(ρ' + 2ρ''z), ρ'/that), each fit with
its own loss and f_scale. A fit that stops keeps its values: the arithmetic of the others
goes on around it under masks, and every ``CHECK_EVERY`` iterations (on a GPU one small
host read) the running count ends the loop or, when at most ``GATHER_SHARE`` of the fits
still run, gathers those into a smaller batch so that finished fits cost nothing. The
rules (λ, D, the fit tests and codes, the robust rows) are ``_rules``'s, which the
single fit and `NielsenDamping` use too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Protocol

import torch

from ... import _rules
from ..._lm.robust import rho
from ..fit_tests import FitTests
from . import estimators, normal

__all__ = [
    "CHECK_EVERY",
    "RUNNING",
    "STATUS_MESSAGES",
    "TOO_FEW_POINTS",
    "BatchData",
    "BatchState",
    "InformedState",
    "scaled_jacobian",
    "solve_batch",
]


class BatchModel(Protocol):
    """What the batched driver asks of a model of M fits (``_curve.batch.model`` builds one
    from f by ``torch.func``): ``x_per_fit`` says whether x has a leading fit axis."""

    x_per_fit: bool

    def values(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """f for every fit: (M, N)."""
        ...

    def values_and_jacobian(
        self, theta: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(f, ∂f/∂θ) for every fit: (M, N) and (M, N, P)."""
        ...


#: Iterations between the reads of how many fits still run, on a GPU (a host transfer)
#: and on the CPU (a plain read, every iteration).
CHECK_EVERY = {"cuda": 4, "cpu": 1}
#: The batch is gathered down to its running fits when at most this share of it runs:
#: gathering early and often costs less than iterating on finished fits (measured on 2-D
#: Gaussian spots, ``bench_batch_fit``).
GATHER_SHARE = 0.8
#: The status of a fit that has not stopped.
RUNNING = -9
#: λ beyond which a fit whose damped system still cannot be factorised is called singular.
_LAMBDA_MAX = 1e30

#: Each fit's status: SciPy's ``least_squares`` codes 0-4, and two of Gpufit's states.
STATUS_MESSAGES = {
    **_rules.STATUS_MESSAGES,
    -1: "Singular: J has a (numerically) zero column at the solution, a parameter the data "
    "do not determine (its variances inf), or the damped normal equations could not be "
    "factorised at any damping.",
    -2: "Non-finite: f or its Jacobian is NaN or infinite at the start or at the current point.",
    -3: "Too few points: the NaN points omitted left fewer points than parameters.",
    -4: "Non-positive model: f <= 0 at a point with counts (or f < 0), where the Poisson "
    "likelihood is undefined, at the start.",
}
#: The status of a fit that ``nan_policy="omit"`` left with fewer points than parameters.
TOO_FEW_POINTS = -3


@dataclass(frozen=True)
class BatchData:
    """One chunk of fits on its device: x (shared or per fit), y, w = 1/σ (None: σ = 1),
    the mask of points kept (None: all), bounds (M × P), each fit's loss (an index into ``losses``)
    and f_scale (M,); ``free`` (M × P, None: all) marks the parameters fitted, the others
    held at p0 (their columns of J zero), and ``estimator`` names the cost
    (``_curve.batched_lm.estimators``)."""

    x: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor | None
    mask: torch.Tensor | None
    lower: torch.Tensor
    upper: torch.Tensor
    losses: tuple[str, ...]
    loss_index: torch.Tensor
    f_scale: torch.Tensor
    free: torch.Tensor | None = None
    estimator: str = "lse"

    def take(self, index: torch.Tensor, x_per_fit: bool) -> BatchData:
        """The fits ``index`` of this chunk."""
        return replace(
            self,
            x=self.x[index] if x_per_fit else self.x,
            y=self.y[index],
            w=None if self.w is None else self.w[index],
            mask=None if self.mask is None else self.mask[index],
            lower=self.lower[index],
            upper=self.upper[index],
            loss_index=self.loss_index[index],
            f_scale=self.f_scale[index],
            free=None if self.free is None else self.free[index],
        )


@dataclass(frozen=True)
class BatchState:
    """Every fit's LM state (leading axis M). ``rows`` scales J's rows for a robust loss
    (ones for the linear one), ``rs`` is the scaled r; with J̃ the Jacobian with its rows
    scaled, ``gram`` is J̃ᵀJ̃ (M × P × P) and ``g`` is J̃ᵀr̃ (M × P): J itself is not kept."""

    p: torch.Tensor
    r: torch.Tensor
    cost: torch.Tensor
    rows: torch.Tensor
    rs: torch.Tensor
    gram: torch.Tensor
    g: torch.Tensor
    d: torch.Tensor
    lam: torch.Tensor
    nu: torch.Tensor
    nfev: torch.Tensor
    njev: torch.Tensor
    steps: torch.Tensor
    status: torch.Tensor

    def take(self, index: torch.Tensor) -> BatchState:
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def put(self, index: torch.Tensor, part: BatchState) -> BatchState:
        """This state with the fits ``index`` overwritten, in place, by ``part``'s."""
        for f in fields(self):
            getattr(self, f.name)[index] = getattr(part, f.name)
        return self


@dataclass(frozen=True)
class InformedState(BatchState):
    """A Poisson fit's state with ``info``, the Fisher information at p (M × P × P) of the
    fits that stopped on an accepted trial, NaN for the others (``estimators.informed``):
    pcov without evaluating those fits again."""

    info: torch.Tensor


def _measure(r: torch.Tensor, data: BatchData) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(C = ½Σc²ρ(z), row scale of J, scaled r) per fit, for each fit's loss (the
    estimator's C and rows for another estimator than least squares)."""
    if data.estimator != "lse":
        return estimators.measure(data.estimator, r, data.y)
    if data.losses == ("linear",):
        return 0.5 * (r * r).sum(1), torch.ones_like(r), r
    c = data.f_scale[:, None]
    z = (r / c) ** 2
    value = torch.zeros_like(r)
    first = torch.zeros_like(r)
    second = torch.zeros_like(r)
    for k, name in enumerate(data.losses):
        here = (data.loss_index == k)[:, None]
        v, d1, d2 = rho(name, z)
        value, first, second = (
            torch.where(here, v, value),
            torch.where(here, d1, first),
            torch.where(here, d2, second),
        )
    scale, scaled = _rules.robust_scaling(r, z, first, second)
    return 0.5 * (c[:, 0] ** 2) * value.sum(1), scale, scaled


def _residuals(
    values: torch.Tensor, jac: torch.Tensor, data: BatchData
) -> tuple[torch.Tensor, torch.Tensor]:
    r, j = values - data.y, jac
    if data.w is not None:
        r, j = data.w * r, data.w[..., None] * j
    if data.mask is not None:
        r = torch.where(data.mask, r, torch.zeros_like(r))
        j = torch.where(data.mask[..., None], j, torch.zeros_like(j))
    if data.free is not None:
        j = torch.where(data.free[:, None, :], j, torch.zeros_like(j))
    return r, j


def _scaled_rows(j: torch.Tensor, rows: torch.Tensor, data: BatchData) -> torch.Tensor:
    """J with its rows scaled for a robust loss (J itself for the linear one)."""
    return j if data.losses == ("linear",) and data.estimator == "lse" else j * rows[..., None]


def scaled_jacobian(
    model: BatchModel, state: BatchState, data: BatchData, index: torch.Tensor
) -> torch.Tensor:
    """J̃ (rows scaled) at the current p of the fits ``index``: the state keeps only J̃ᵀJ̃
    and J̃ᵀr̃, and the covariance's pseudo-inverse of the rare ill-conditioned fit needs
    J̃'s singular values."""
    part = data.take(index, model.x_per_fit)
    values, jac = model.values_and_jacobian(state.p[index], part.x)
    return _scaled_rows(_residuals(values, jac, part)[1], state.rows[index], part)


def _normal(
    j: torch.Tensor, rows: torch.Tensor, rs: torch.Tensor, data: BatchData
) -> tuple[torch.Tensor, torch.Tensor]:
    """(J̃ᵀJ̃, J̃ᵀr̃) per fit from J (M × N × P): the reductions over the points that J's
    producer fuses into (``normal.products``), so that a compiled iteration never writes
    J to memory; another estimator's own products (``estimators.normal``)."""
    if data.estimator != "lse":
        return estimators.normal(data.estimator, j, rows, data.y)
    return normal.products(_scaled_rows(j, rows, data), rs)


def start_state(model: BatchModel, p0: torch.Tensor, data: BatchData) -> BatchState:
    """The state at p0 (clipped into the bounds): one evaluation, one Jacobian."""
    p = torch.clamp(p0, data.lower, data.upper)
    values, jac = model.values_and_jacobian(p, data.x)
    r, j = _residuals(values, jac, data)
    cost, rows, rs = _measure(r, data)
    gram, g = _normal(j, rows, rs, data)
    norms = normal.column_norms(gram)
    d = _rules.start_scaling(norms)
    lam = _rules.start_damping(norms, d)
    finite = normal.finite(r, gram, g)
    count = torch.ones(p.shape[0], dtype=torch.int64, device=p.device)
    status = torch.where(finite, RUNNING, -2)
    state = BatchState(
        p,
        r,
        cost,
        rows,
        rs,
        gram,
        g,
        d,
        lam,
        torch.full_like(cost, _rules.NU_START),
        count,
        count.clone(),
        torch.zeros_like(count),
        status,
    )
    if data.estimator == "lse":
        return state
    return InformedState(**vars(state), info=torch.full_like(gram, torch.nan))


def _damped_step(s: BatchState, held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """δ (M × P) from the scaled damped system, and whether each fit's factorisation held."""
    free = ~held
    g = s.g
    gram = s.gram / (s.d[:, :, None] * s.d[:, None, :])
    both = free[:, :, None] & free[:, None, :]
    eye = torch.eye(s.p.shape[1], dtype=s.p.dtype, device=s.p.device)
    diagonal = torch.where(free, s.lam[:, None], torch.ones_like(s.lam[:, None]))
    system = torch.where(both, gram, torch.zeros_like(gram)) + eye * diagonal[:, None, :]
    factor, info = torch.linalg.cholesky_ex(system)
    rhs = torch.where(free, g / s.d, torch.zeros_like(g))
    u = torch.cholesky_solve(rhs[..., None], factor)[..., 0]
    ok = (info == 0) & torch.isfinite(u).all(1)
    return torch.where(ok[:, None], u / s.d, torch.zeros_like(u)), ok


def _iterate(
    model: BatchModel, s: BatchState, data: BatchData, tol: dict[str, float], max_nfev: int
) -> BatchState:
    """One trial for every running fit (module docstring)."""
    g = s.g
    held = _rules.held_at_bounds(s.p, data.lower, data.upper, g)
    running = s.status == RUNNING
    size = torch.sqrt((s.rs * s.rs).sum(1))
    small_gradient = _rules.gtol_met(g, held, normal.column_norms(s.gram), size, tol["gtol"])
    status = torch.where(running & small_gradient, 1, s.status)
    status = torch.where((status == RUNNING) & (s.nfev >= max_nfev), 0, status)
    running = status == RUNNING
    delta, solved = _damped_step(s, held)
    trial = torch.clamp(s.p - delta, data.lower, data.upper)
    step = trial - s.p
    values, jac = model.values_and_jacobian(trial, data.x)
    r_new, j_new = _residuals(values, jac, data)
    cost_new, rows_new, rs_new = _measure(r_new, data)
    gram_new, g_new = _normal(j_new, rows_new, rs_new, data)
    finite = normal.finite(r_new, gram_new, g_new)
    predicted = normal.predicted(s.cost, s.rs, s.gram, s.g, step, data.losses == ("linear",))
    actual = s.cost - cost_new
    ratio = _rules.gain_ratio(actual, predicted)
    small_step = _rules.xtol_met(s.d, step, s.p, tol["xtol"])
    tried = running & solved
    accept = tried & finite & (actual > 0)
    reject = (tried & ~accept) | (running & ~solved)
    ftol_ok = accept & _rules.ftol_met(actual, s.cost, ratio, tol["ftol"])
    stop_small = small_step & tried & finite
    done = _rules.stop_status(ftol_ok, small_step)
    status = torch.where(stop_small | ftol_ok, done, status)
    raised, doubled = _rules.nielsen_reject(s.lam, s.nu)
    lam = torch.where(
        accept, _rules.nielsen_accept(s.lam, ratio), torch.where(reject, raised, s.lam)
    )
    nu = torch.where(
        accept, torch.full_like(s.nu, _rules.NU_START), torch.where(reject, doubled, s.nu)
    )
    status = torch.where(running & ~solved & (lam > _LAMBDA_MAX), -1, status)
    a1, a3 = accept[:, None], accept[:, None, None]
    norms_new = normal.column_norms(gram_new)
    new = BatchState(
        p=torch.where(a1, trial, s.p),
        r=torch.where(a1, r_new, s.r),
        cost=torch.where(accept, cost_new, s.cost),
        rows=torch.where(a1, rows_new, s.rows),
        rs=torch.where(a1, rs_new, s.rs),
        gram=torch.where(a3, gram_new, s.gram),
        g=torch.where(a1, g_new, s.g),
        d=torch.where(a1, _rules.updated_scaling(s.d, norms_new), s.d),
        lam=lam,
        nu=nu,
        nfev=s.nfev + tried.to(s.nfev.dtype),
        njev=s.njev + accept.to(s.njev.dtype),
        steps=s.steps + tried.to(s.steps.dtype),
        status=status,
    )
    if not isinstance(s, InformedState):
        return new
    stop = accept & (status != RUNNING)
    info = estimators.informed(s.info, stop, j_new, r_new + data.y)
    return InformedState(**vars(new), info=info)


def solve_batch(
    model: BatchModel,
    p0: torch.Tensor,
    data: BatchData,
    *,
    tests: FitTests,
    iterate: Callable[..., BatchState] | None = None,
    initial: Callable[..., BatchState] | None = None,
) -> BatchState:
    """LM from p0 (M × P) for every fit of ``data`` until each stops (module docstring);
    ``iterate`` and ``initial`` replace ``_iterate`` and ``start_state`` (same results:
    ``_curve.compiled_lm``; ``initial`` is given the tolerances and budget too, which key
    its kernel)."""
    tol, max_nfev = tests.tolerances(), tests.max_nfev
    if initial is None:
        whole = start_state(model, p0, data)
    else:
        whole = initial(model, p0, data, (tol, max_nfev))
    index = torch.arange(p0.shape[0], device=p0.device)
    state, part = whole, data
    # Each iteration either spends an evaluation of every running fit or raises the λ of
    # those whose system failed; the bound below is never reached in practice.
    every = CHECK_EVERY.get(p0.device.type, 4)
    limit = max_nfev + 4 * every + 120
    for iteration in range(1, limit + 1):
        state = (iterate or _iterate)(model, state, part, tol, max_nfev)
        if iteration % every:
            continue
        running = state.status == RUNNING
        count = int(running.sum())
        if count == 0:
            break
        if count <= GATHER_SHARE * state.p.shape[0]:
            whole = whole.put(index, state)
            keep = torch.nonzero(running).reshape(-1)
            index = index[keep]
            state = state.take(keep)
            part = part.take(keep, model.x_per_fit)
    else:
        state = replace(state, status=torch.where(state.status == RUNNING, 0, state.status))
    return whole.put(index, state)
