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
single fit and `NielsenDamping` use too. The state and the data are
``_curve.batched_lm.state``'s; the iteration's phases and the start state
``_curve.batched_lm.phases``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..fit_tests import FitTests
from .phases import iterate as _iterate
from .phases import start_state
from .state import RUNNING, BatchData, BatchModel, BatchState

__all__ = ["CHECK_EVERY", "GATHER_SHARE", "solve_batch"]

#: Iterations between the reads of how many fits still run, on a GPU (a host transfer)
#: and on the CPU (a plain read, every iteration).
CHECK_EVERY = {"cuda": 4, "cpu": 1}
#: The batch is gathered down to its running fits when at most this share of it runs:
#: gathering early and often costs less than iterating on finished fits (measured on 2-D
#: Gaussian spots, ``bench_batch_fit``).
GATHER_SHARE = 0.8


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
    ``_curve.compiled_lm``)."""
    tol, max_nfev = tests.tolerances(), tests.max_nfev
    whole = (initial or start_state)(model, p0, data)
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
