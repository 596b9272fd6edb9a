"""One batched LM iteration in phases, and the start state.

An iteration of ``_curve.batched_lm.driver`` is, for every fit:

* ``attempt``: the gtol and budget tests, and the damped step from the kept J̃ᵀJ̃ and J̃ᵀr̃
  (the scaled P × P system, a batched Cholesky factorisation), projected onto the bounds:
  the trial;
* ``evaluate``: f and its Jacobian at the trial, the residuals, the cost, J̃ᵀJ̃ and J̃ᵀr̃
  (the only phase that calls the model);
* ``decide``: accept or reject each trial, λ's move (Nielsen's rule), ftol and xtol, the
  new state's fields of one value, vector or matrix per fit;
* ``kept``: the new state's fields of one value per point (r, the row scales, r̃), the
  accepted trial's or the old.

``attempt`` and ``decide`` depend neither on the model nor on the number of points:
``_curve.compiled_lm`` compiles them once per parameter count P, and a model's own kernel
is ``evaluate`` alone (the start state is ``evaluate`` at p0 and ``begin``). ``iterate``
runs the four in turn, eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ... import _rules
from ..._lm.robust import rho
from . import estimators, normal
from .state import (
    LAMBDA_MAX,
    RUNNING,
    BatchData,
    BatchModel,
    BatchState,
    InformedState,
    Reduced,
)

__all__ = [
    "Attempt",
    "Evaluation",
    "attempt",
    "begin",
    "decide",
    "evaluate",
    "iterate",
    "kept",
    "scaled_jacobian",
    "squares",
    "start_state",
]


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


@dataclass(frozen=True)
class Evaluation(Reduced):
    """f and J at a point, reduced (``Reduced``), whether all of it is finite, and J itself
    where the Poisson estimator's information needs it (else None)."""

    finite: torch.Tensor
    j: torch.Tensor | None = None


def evaluate(model: BatchModel, p: torch.Tensor, data: BatchData) -> Evaluation:
    """f and J at ``p`` (M × P) for every fit, reduced (``Evaluation``)."""
    values, jac = model.values_and_jacobian(p, data.x)
    r, j = _residuals(values, jac, data)
    cost, rows, rs = _measure(r, data)
    gram, g = _normal(j, rows, rs, data)
    kept_j = None if data.estimator == "lse" else j
    return Evaluation(r, cost, rows, rs, gram, g, normal.finite(r, gram, g), kept_j)


def begin(p: torch.Tensor, e: Evaluation, data: BatchData) -> BatchState:
    """The state at ``p`` from its evaluation: MINPACK's starting scaling and λ."""
    norms = normal.column_norms(e.gram)
    d = _rules.start_scaling(norms)
    lam = _rules.start_damping(norms, d)
    count = torch.ones(p.shape[0], dtype=torch.int64, device=p.device)
    status = torch.where(e.finite, RUNNING, -2)
    nu = torch.full_like(e.cost, _rules.NU_START)
    steps = torch.zeros_like(count)
    state = BatchState(**e.reduced(), p=p, d=d, lam=lam, nu=nu, nfev=count,
                       njev=count.clone(), steps=steps, status=status)  # fmt: skip
    if data.estimator == "lse":
        return state
    return InformedState(**vars(state), info=torch.full_like(e.gram, torch.nan))


def start_state(model: BatchModel, p0: torch.Tensor, data: BatchData) -> BatchState:
    """The state at p0 (clipped into the bounds): one evaluation, one Jacobian."""
    p = torch.clamp(p0, data.lower, data.upper)
    return begin(p, evaluate(model, p, data), data)


def squares(s: BatchState, data: BatchData) -> torch.Tensor:
    """‖r̃‖² per fit (M,): 2C for least squares with the linear loss, where r̃ = r."""
    if data.losses == ("linear",) and data.estimator == "lse":
        return 2.0 * s.cost
    return (s.rs * s.rs).sum(1)


@dataclass(frozen=True)
class Attempt:
    """One iteration's trial point, the step to it, whether each fit's damped system was
    solved, and the status after the gtol and budget tests."""

    trial: torch.Tensor
    step: torch.Tensor
    solved: torch.Tensor
    status: torch.Tensor


def attempt(
    s: BatchState,
    size2: torch.Tensor,
    bounds: tuple[torch.Tensor, torch.Tensor],
    gtol: float,
    max_nfev: int,
) -> Attempt:
    """The trial of every fit from ``s`` within ``bounds`` (lower, upper: M × P; ``size2``:
    ``squares``). Reads the state's fields of one value, vector or matrix per fit only."""
    lower, upper = bounds
    held = _rules.held_at_bounds(s.p, lower, upper, s.g)
    running = s.status == RUNNING
    norms = normal.column_norms(s.gram)
    small_gradient = _rules.gtol_met(s.g, held, norms, torch.sqrt(size2), gtol)
    status = torch.where(running & small_gradient, 1, s.status)
    status = torch.where((status == RUNNING) & (s.nfev >= max_nfev), 0, status)
    delta, solved = _damped_step(s, held)
    trial = torch.clamp(s.p - delta, lower, upper)
    return Attempt(trial, trial - s.p, solved, status)


def _damped_step(s: BatchState, held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """δ (M × P) from the scaled damped system, and whether each fit's factorisation held."""
    free = ~held
    gram = s.gram / (s.d[:, :, None] * s.d[:, None, :])
    both = free[:, :, None] & free[:, None, :]
    eye = torch.eye(s.p.shape[1], dtype=s.p.dtype, device=s.p.device)
    diagonal = torch.where(free, s.lam[:, None], torch.ones_like(s.lam[:, None]))
    system = torch.where(both, gram, torch.zeros_like(gram)) + eye * diagonal[:, None, :]
    factor, info = torch.linalg.cholesky_ex(system)
    rhs = torch.where(free, s.g / s.d, torch.zeros_like(s.g))
    u = torch.cholesky_solve(rhs[..., None], factor)[..., 0]
    ok = (info == 0) & torch.isfinite(u).all(1)
    return torch.where(ok[:, None], u / s.d, torch.zeros_like(u)), ok


def decide(
    s: BatchState,
    a: Attempt,
    e: Evaluation,
    size2: torch.Tensor,
    tol: dict[str, float],
    linear: bool,
) -> tuple[BatchState, torch.Tensor]:
    """Accept or reject every fit's trial (``a``, evaluated: ``e``): the new state, its
    fields of one value per point still ``s``'s (``kept`` puts the trial's in), and the
    fits that accepted. Reads ``e``'s cost, J̃ᵀJ̃, J̃ᵀr̃ and finiteness only; ``linear``:
    every fit's loss is the linear one (``normal.predicted``)."""
    running = a.status == RUNNING
    predicted = normal.predicted(s.cost, size2, s.gram, s.g, a.step, linear)
    actual = s.cost - e.cost
    ratio = _rules.gain_ratio(actual, predicted)
    small_step = _rules.xtol_met(s.d, a.step, s.p, tol["xtol"])
    tried = running & a.solved
    accept = tried & e.finite & (actual > 0)
    reject = (tried & ~accept) | (running & ~a.solved)
    ftol_ok = accept & _rules.ftol_met(actual, s.cost, ratio, tol["ftol"])
    stop_small = small_step & tried & e.finite
    status = torch.where(stop_small | ftol_ok, _rules.stop_status(ftol_ok, small_step), a.status)
    raised, doubled = _rules.nielsen_reject(s.lam, s.nu)
    lam = torch.where(
        accept, _rules.nielsen_accept(s.lam, ratio), torch.where(reject, raised, s.lam)
    )
    nu = torch.where(
        accept, torch.full_like(s.nu, _rules.NU_START), torch.where(reject, doubled, s.nu)
    )
    status = torch.where(running & ~a.solved & (lam > LAMBDA_MAX), -1, status)
    a1, a3 = accept[:, None], accept[:, None, None]
    norms_new = normal.column_norms(e.gram)
    new = replace(
        s,
        p=torch.where(a1, a.trial, s.p),
        cost=torch.where(accept, e.cost, s.cost),
        gram=torch.where(a3, e.gram, s.gram),
        g=torch.where(a1, e.g, s.g),
        d=torch.where(a1, _rules.updated_scaling(s.d, norms_new), s.d),
        lam=lam,
        nu=nu,
        nfev=s.nfev + tried.to(s.nfev.dtype),
        njev=s.njev + accept.to(s.njev.dtype),
        steps=s.steps + tried.to(s.steps.dtype),
        status=status,
    )
    return new, accept


def kept(
    new: BatchState, s: BatchState, e: Evaluation, accept: torch.Tensor, data: BatchData
) -> BatchState:
    """``new`` with r, the row scales and r̃ of the fits that accepted their trial (``e``'s)
    and of the others (``s``'s): with the linear loss the row scales are ones (``e``'s, a
    tensor of the new state's own) and r̃ is r."""
    a1 = accept[:, None]
    r = torch.where(a1, e.r, s.r)
    if data.losses == ("linear",) and data.estimator == "lse":
        return replace(new, r=r, rows=e.rows, rs=r)
    return replace(new, r=r, rows=torch.where(a1, e.rows, s.rows), rs=torch.where(a1, e.rs, s.rs))


def iterate(
    model: BatchModel, s: BatchState, data: BatchData, tol: dict[str, float], max_nfev: int
) -> BatchState:
    """One trial for every running fit: the phases in turn (module docstring)."""
    size2 = squares(s, data)
    a = attempt(s, size2, (data.lower, data.upper), tol["gtol"], max_nfev)
    e = evaluate(model, a.trial, data)
    decided, accept = decide(s, a, e, size2, tol, data.losses == ("linear",))
    new = kept(decided, s, e, accept, data)
    if not isinstance(new, InformedState) or e.j is None:
        return new
    stop = accept & (new.status != RUNNING)
    return replace(new, info=estimators.informed(new.info, stop, e.j, e.r + data.y))
