"""LM's runs in the PINN suite (``bench_pinn_suite.py``): the method names and the switches
each turns on, and `lm_stepper`, one LM step of a run with its switches.

Switches (each off in ``lm``; a method name lists the ones it turns on):

* ``hard``: the side conditions built into the network (``pinn_problem.with_built_in``);
* ``periodic``: a network periodic in x by construction (``with_periodic``);
* ``causal``: the equation's rows weighed by time bin (``with_causal_weights``), the
  weights updated before every step and ε annealed along 1e-2, 1e-1, 1, 10, 100 once every
  bin's weight exceeds 0.99 (``CausalWeights.anneal``);
* ``march``: ten windows in time fitted in turn, an equal share of the budget each
  (``pinn_marching.Marching``);
* ``rad``: residual-based points (``Collocation(power=1)``: a quarter of the points redrawn
  every step, kept with probability ∝ |r|/mean|r| + 1; Wu et al. 2023);
* ``resample``: a quarter of the points redrawn uniformly every step;
* ``tutorial``: geodesic acceleration 0.75 and ``scaling_memory=1``;
* ``windows`` (Allen–Cahn): twenty windows in time, the initial condition built into each
  window (u = b_k(x) + (t − t_k)·N_k, b_k where the last window ended), a periodic network,
  the initial data's corner at x = ±1 in closed form, LM steps on each window until its
  residual is small, its 40 steps are spent or the run has spent the window's share of
  the budget (``pinn_allen_cahn.Windows``); one thread (small steps, which a second thread
  on a loaded two-core machine made slower: benchmarks/NOTES.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pinn_allen_cahn
import pinn_suite
import torch
from pinn_marching import Marching
from torch import nn

from marquardt.solver import LMA
from marquardt.solver._curve.threads import torch_threads

#: By LM method, its switches.
SWITCHES: dict[str, tuple[str, ...]] = {
    "lm": (),
    "lm_resample": ("resample",),
    "lm_tutorial": ("tutorial",),
    "lm_hard": ("hard",),
    "lm_causal": ("causal",),
    "lm_periodic": ("periodic",),
    "lm_periodic_causal": ("periodic", "causal"),
    "lm_periodic_march": ("periodic", "march"),
    "lm_hard_rad": ("hard", "rad"),
    "lm_windows": ("windows",),
}
#: Why a run of the method stopped when its stepper says it is done (LM's damping at its
#: ceiling, unless named here).
FINISHED = {"lm_windows": "the last window fitted"}
TUTORIAL_SETTINGS = {"geodesic": 0.75, "scaling_memory": 1.0}
ANNEAL = (1e-2, 1e-1, 1.0, 10.0, 100.0)
WINDOWS = 10


def lm_stepper(
    name: str, method: str, budget: float, spent: list[float]
) -> tuple[pinn_suite.Problem, Callable[[], bool], Callable[[], nn.Module]]:
    """The problem as ``method`` changes it, one LM step of the run (True: stop), and the
    model whose error is measured; ``spent`` is the run's clock (``spent[0]``, seconds)."""
    switches = SWITCHES[method]
    problem = pinn_suite.problem(name)
    if "windows" in switches:
        return _windows_stepper(problem, budget, spent)
    causal = None
    if "hard" in switches:
        problem = pinn_suite.with_built_in(problem)
    if "periodic" in switches:
        problem = pinn_suite.with_periodic(problem)
    if "causal" in switches:
        problem, causal = pinn_suite.with_causal_weights(problem, epsilon=ANNEAL[0])
    model = problem.network()
    marching = Marching(problem, model, WINDOWS) if "march" in switches else None
    settings: dict[str, Any] = TUTORIAL_SETTINGS if "tutorial" in switches else {}
    state: dict[str, Any] = {}

    def start(current: pinn_suite.Problem) -> None:
        state["problem"] = current
        state["batch"] = list(current.batch(torch.Generator().manual_seed(0)))
        state["lma"] = LMA(model, [torch.device("cpu")], current.residual, **settings)
        state["points"] = None
        if "resample" in switches:
            state["points"] = current.collocation(seed=1)
        elif "rad" in switches:
            state["points"] = current.collocation(model, seed=1, power=1.0)

    start(marching.current if marching else problem)

    def step() -> bool:
        due = marching is not None and spent[0] >= (marching.index + 1) * budget / WINDOWS
        if marching is not None and due and marching.index < WINDOWS - 1:
            start(marching.advance())
        batch, points = state["batch"], state["points"]
        if points is not None:
            batch[:] = points.next_batch()
        if causal is not None:
            causal.update(state["problem"].residual, model, batch[0], batch[1])
            causal.anneal(ANNEAL)
        _, terminated = state["lma"].step(batch[0], batch[1])
        return bool(terminated) and points is None and marching is None

    def view() -> nn.Module:
        return marching.solution() if marching else model

    return problem, step, view


def _windows_stepper(
    problem: pinn_suite.Problem, budget: float, spent: list[float]
) -> tuple[pinn_suite.Problem, Callable[[], bool], Callable[[], nn.Module]]:
    """`lm_stepper` for ``windows``: Allen–Cahn's windows one LM step a call (True: the
    last window is done), each window also ended once the run has spent its share of the
    budget (window k by (k + 1)/windows of it), so that a slow machine fits every window."""
    if problem.name != "allen_cahn":
        raise ValueError(f"the windows of pinn_allen_cahn are Allen–Cahn's, not {problem.name!r}'s")
    windows = pinn_allen_cahn.Windows(pinn_allen_cahn.MarchSettings())
    share = budget / windows.settings.windows

    def step() -> bool:
        with torch_threads(1):
            if windows.step():
                return True
        k = windows.index
        return (
            spent[0] >= (k + 1) * share and k + 1 < windows.settings.windows and windows.advance()
        )

    return problem, step, lambda: windows.solution
