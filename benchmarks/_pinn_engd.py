"""The energy-natural-gradient paper's 2-D Poisson (Müller & Zeinhofer 2023, first example):
time to its accuracy, and one LM step beside the floor of its arithmetic.

−Δu = 2π² sin(πx) sin(πy) on the unit square, u = 0 on its edge; a 2-32-1 tanh network
(P = 129), a 28 × 28 interior grid (784 points) and 116 points on the edge, float64, two
threads. Measured:

* LM (geodesic acceleration 0.75, ``scaling_memory=1``, the PINN tutorial's settings)
  stepping until the budget, the relative L2 error on a 41 × 41 grid every 10 steps (the
  clock excludes it): the seconds to 1e-6 and the error at the budget (targets: 1e-6 in
  3 s, ≤ 1e-7 in 60 s);
* the median step, over ``steps`` steps after the fit above, of that LM and of LM with its
  defaults (no geodesic acceleration: one Jacobian per step), beside the floor: J by the
  same mode (the engine's forward-Laplacian J, the planner's chunks), JᵀJ and a 129 × 129
  Cholesky factorisation, timed alone (target: one step ≤ 5 ms);
* the same system as one function (``PinnStep``: J per point by reverse mode through the
  forward Laplacian written over θ, JᵀJ, Jᵀr, Cholesky, the solve), eager and compiled
  (``torch.compile``, inductor), in turn, medians of ``steps`` after the compile, and the
  compile's seconds.

Writes ``results/pinn_engd.json``; ``bench_pinn.py``'s report shows it. On a GPU,
``bench_pinn.py --device cuda`` measures the last of these alone there (``device_steps``:
the network and points on the device, each step's clock stopped after the device has
finished) and records it in its own results::

    python benchmarks/_child.py _pinn_engd main '[60.0]'   # [10.0, 50, true]: a quick run
    python benchmarks/_child.py _pinn_engd device_steps '["cuda:0", 20]'
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import _machine
import torch
from _common import setup_threads, suffix, synchronize, write_json

from marquardt.jacobian import JacobianEngine, PinnStep, Replicas
from marquardt.solver import LMA
from marquardt.testing.problems import poisson_exact, poisson_residual, poisson_source, tanh_mlp

SETTINGS = {"geodesic": 0.75, "scaling_memory": 1.0}
MARKS = (1e-4, 1e-5, 1e-6, 1e-7, 1e-8)


def problem() -> tuple[torch.nn.Module, Any, torch.Tensor, torch.Tensor]:
    """The network (seed 0), the residual and the batch of the paper's setup."""
    net = tanh_mlp([2, 32, 1], 0).double()
    g = torch.linspace(0, 1, 30, dtype=torch.float64)[1:-1]
    inner = torch.cartesian_prod(g, g)
    t = torch.linspace(0, 1, 30, dtype=torch.float64)[:-1]
    zero, one = torch.zeros_like(t), torch.ones_like(t)
    sides = ((t, zero), (one, t), (1 - t, one), (zero, 1 - t))
    edge = torch.cat([torch.stack(p, 1) for p in sides])
    residual = poisson_residual()
    x, y = residual.batch(pde=(inner, poisson_source(inner)), boundary=edge)
    return net, residual, x, y


def _error(net: torch.nn.Module, grid: torch.Tensor, exact: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(grid)[:, 0] - exact).norm() / exact.norm())


def _fit(budget: float) -> dict[str, Any]:
    net, residual, x, y = problem()
    lma = LMA(net, [torch.device("cpu")], residual, **SETTINGS)
    g = torch.linspace(0, 1, 41, dtype=torch.float64)
    grid = torch.cartesian_prod(g, g)
    exact = poisson_exact(grid)
    spent, steps, reached = 0.0, 0, {}
    trace = [(0.0, _error(net, grid, exact))]
    while spent < budget:
        t0 = time.perf_counter()
        lma.step(x, y)
        spent += time.perf_counter() - t0
        steps += 1
        if steps % 10 == 0:
            err = _error(net, grid, exact)
            trace.append((spent, err))
            for mark in MARKS:
                if err <= mark:
                    reached.setdefault(str(mark), [spent, steps])
    trace.append((spent, _error(net, grid, exact)))
    return {
        "seconds": spent,
        "steps": steps,
        "final": trace[-1][1],
        "reached": reached,
        "trace": [*trace[:: max(1, len(trace) // 100)], trace[-1]],
    }


def _median(fn: Any, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _steps(repeats: int) -> dict[str, Any]:
    """Median step of each LM setting (from the same start, after 20 steps) and the floor."""
    out: dict[str, Any] = {}
    for label, settings in (("geodesic", SETTINGS), ("defaults", {})):
        net, residual, x, y = problem()
        lma = LMA(net, [torch.device("cpu")], residual, **settings)
        for _ in range(20):
            lma.step(x, y)
        out[label] = _median(lambda lma=lma, x=x, y=y: lma.step(x, y), repeats)
        report = lma.report
        assert report is not None
        out[f"{label}_parts"] = (
            f"J {report.seconds_jacobian * 1e3:.1f} ms, assembly "
            f"{report.seconds_assembly * 1e3:.1f} ms, solve {report.seconds_solve * 1e3:.1f} ms, "
            f"attempts {report.seconds_trial * 1e3:.1f} ms"
        )
    net, residual, x, y = problem()
    engine = JacobianEngine(Replicas(net, ["cpu"]), residual)
    eye = torch.eye(129, dtype=torch.float64)

    def floor() -> None:
        jac, _ = engine.jacobian(x, y)
        torch.linalg.cholesky(jac.T @ jac + eye)

    out["floor"] = _median(floor, repeats)
    out["floor_mode"] = engine.last_plan.mode if engine.last_plan is not None else "?"
    out.update(_pinn_steps(repeats))
    return out


def _pinn_steps(repeats: int, device: str = "cpu") -> dict[str, float]:
    """``PinnStep``'s step on ``device``, eager and compiled, timed in turn (medians, so
    that a change of load falls on both; each until the device has finished), and the
    seconds of the compile (its first call)."""
    net, residual, x, y = problem()
    where = torch.device(device)
    net, x, y = net.to(where), x.to(where), y.to(where)
    eager = PinnStep(net, residual, x, y)
    compiled = PinnStep(net, residual, x, y, compile=True)

    def timed(step: PinnStep) -> float:
        synchronize(where)
        t0 = time.perf_counter()
        step.step(1e-3)
        synchronize(where)
        return time.perf_counter() - t0

    timed(eager)
    out = {"pinn_step_compile_s": timed(compiled)}
    times: dict[str, list[float]] = {"pinn_step_eager": [], "pinn_step_compiled": []}
    for _ in range(repeats):
        for name, step in (("pinn_step_eager", eager), ("pinn_step_compiled", compiled)):
            times[name].append(timed(step))
    out.update({name: statistics.median(t) for name, t in times.items()})
    out["pinn_step_compiled_ran"] = float(compiled.compiled)
    return out


def device_steps(device: str, repeats: int = 20) -> dict[str, Any]:
    """``PinnStep``'s step on ``device`` alone (``_pinn_steps``), with the machine and load.

    **Arguments:** ``device``: a torch device ("cuda:0"); ``repeats``: the timed steps of
    each side after the compile.

    **Returns:** the figures (``pinn_step_eager``, ``pinn_step_compiled``: median seconds;
    ``pinn_step_compile_s``; ``pinn_step_compiled_ran``: 1.0 where the compiled step did not
    fall back to the eager one), ``repeats``, ``device``, the machine and the load.
    """
    load = _machine.load_average()
    out: dict[str, Any] = {"device": device, "repeats": repeats, "load_before": load}
    out.update(_pinn_steps(repeats, device))
    out["machine"] = _machine.describe(device)
    out["load_after"] = _machine.load_average()
    return out


def main(budget: float = 60.0, repeats: int = 50, quick: bool = False) -> str:
    """Fit for ``budget`` seconds, time the steps (medians of ``repeats``); the JSON's path
    (``results/pinn_engd-quick.json`` for a ``quick`` run, which leaves the recorded one)."""
    setup_threads()
    result: dict[str, Any] = {
        "machine": _machine.describe(),
        "budget_s": budget,
        "repeats": repeats,
        "load_before": _machine.load_average(),
    }
    result["fit"] = _fit(budget)
    result["step_s"] = _steps(repeats)
    result["load_after"] = _machine.load_average()
    return str(write_json("pinn_engd" + suffix(quick), result))
