"""Physics-informed network on the 2-D Poisson problem: our LM against Adam, L-BFGS and
torch-levenberg-marquardt's PINN route, each with the same wall-clock budget.

−Δu = 2π² sin(πx) sin(πy) on the unit square, u = 0 on its boundary (exact solution
u = sin(πx) sin(πy)). Every method trains the same tanh network from the same start
(2-32-32-1, P = 1185; ``--quick``: 2-16-16-1, P = 337) on the same collocation points
(a 36 × 36 interior grid and 148 boundary points; ``--quick``: 20 × 20 and 84), float64:

* ours: ``LMA`` with a ``PointResidual`` (groups "pde" and "boundary"), geodesic
  acceleration and Marquardt's running-maximum scaling;
* Adam on the mean squared residual, its learning rate tuned over {1e-3, 3e-3, 1e-2, 3e-2}
  on a quarter of the budget each (the best final error wins);
* ``torch.optim.LBFGS`` (strong Wolfe line search, history 50);
* torch-levenberg-marquardt 1.2.3, driven as its issue 7 shows for PINNs: a module whose
  forward returns the residuals (targets zero), ``use_vmap=False``; ``max_batch_size=256``
  keeps its batch Jacobian within memory (its whole-batch ``jacrev`` holds N cotangents
  through the graph of N Laplacians). Its forward evaluates both the PDE residual and u
  at every point and keeps the one of the point's group (one function for all rows).

Each method runs in its own process (peak RSS growth over the process after set-up is
its memory; with ``--device cuda``, the peak of CUDA memory allocated over the start); the clock excludes the error evaluations on the 41 × 41 test grid. Writes
``results/pinn.json`` and ``results/pinn_error_time.png``, ``pinn_error_field.png``
(copied to docs/img), and prints the summary rows with their targets.

    python benchmarks/run_all.py pinn [--quick] [--device cuda]
    python benchmarks/_child.py _pinn_orders main '[false, "cpu"]'   # the Jacobian orders
    python benchmarks/_child.py _pinn_step main '[false]'   # the step by the Jacobian's path
    python benchmarks/_child.py _pinn_engd main '[60.0]'   # ENGD's Poisson, P = 129

On a GPU the run also times ENGD's Poisson step as one function (``PinnStep``), eager and
compiled, on the device (``_pinn_engd.device_steps``, in a process of its own after the
methods; ``STEP_REPEATS`` steps each, ``STEP_TIMEOUT`` seconds at most), its rows and
sentence in the GPU's report.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _child as _child_process
import _common as c
import _first_order as first_order
import _machine
import _pinn_report as report
import torch
from _common import setup_threads
from _machine import peak_rss_mib, reset_peak_rss, rss_mib
from _registry import Options
from torch import nn

from marquardt.testing.problems import poisson_exact, poisson_residual, poisson_source

#: The interpreter the methods' processes run in: this one (``nox -s bench`` installs the
#: peer beside marquardt), or one named by ``MARQUARDT_BENCH_PYTHON`` whose environment
#: has torch-levenberg-marquardt (marquardt then comes from PYTHONPATH).
PEER_PYTHON = Path(os.environ.get("MARQUARDT_BENCH_PYTHON", sys.executable))
ADAM_RATES = (1e-3, 3e-3, 1e-2, 3e-2)
#: On a GPU: the timed steps of each side of ``PinnStep`` and the seconds its process may
#: take (the compile included).
STEP_REPEATS = 20
STEP_TIMEOUT = 25.0


# -- the problem ----------------------------------------------------------------------------
def network(hidden: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return (
        nn.Sequential(
            nn.Linear(2, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, 1),
        )
        .double()
        .to(device)
    )


def sizes(quick: bool) -> tuple[int, int]:
    """(hidden width, interior grid side)."""
    return (16, 20) if quick else (32, 36)


def collocation(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.linspace(0, 1, n + 2, dtype=torch.float64)[1:-1]
    inner = torch.cartesian_prod(g, g)
    t = torch.linspace(0, 1, n + 1, dtype=torch.float64)
    zero, one = torch.zeros_like(t), torch.ones_like(t)
    edge = torch.cat([torch.stack(p, 1) for p in ((t, zero), (t, one), (zero, t), (one, t))])
    return inner, edge


class TestGrid:
    """Relative L2 error of u_θ on a 41 × 41 grid of the closed square."""

    def __init__(self, device: torch.device) -> None:
        g = torch.linspace(0, 1, 41, dtype=torch.float64)
        self.x = torch.cartesian_prod(g, g).to(device)
        self.u = poisson_exact(self.x)

    def error(self, model: nn.Module) -> float:
        with torch.no_grad():
            return float((model(self.x)[:, 0] - self.u).norm() / self.u.norm())


# -- the methods (each in its own process) ---------------------------------------------------
def _loop(step: Any, model: nn.Module, grid: TestGrid, budget: float, every: int) -> dict[str, Any]:
    """Call ``step()`` until ``budget`` seconds of stepping; the error every ``every`` steps."""
    trace: list[tuple[float, float]] = [(0.0, grid.error(model))]
    times: list[float] = []
    spent = 0.0
    k = 0
    while spent < budget:
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        spent += dt
        times.append(dt)
        k += 1
        if k % every == 0:
            err = grid.error(model)
            trace.append((spent, err))
            if not math.isfinite(err):
                break
    trace.append((spent, grid.error(model)))
    return {"trace": trace, "steps": k, "step_median_s": statistics.median(times)}


def run_method(
    method: str, budget: float, quick: bool, device: torch.device, lr: float
) -> dict[str, Any]:
    hidden, n = sizes(quick)
    model = network(hidden, device)
    inner, edge = collocation(n)
    grid = TestGrid(device)
    residual = poisson_residual()
    x, y = residual.batch(pde=(inner, poisson_source(inner)), boundary=edge)
    x, y = x.to(device), y.to(device)
    params = dict(model.named_parameters())

    def loss() -> torch.Tensor:
        return residual.rows(model, params, x, y).pow(2).mean()

    if method == "ours":
        from marquardt.solver import LMA

        lma = LMA(model, [device], residual, geodesic=0.75, scaling_memory=1.0)

        def step() -> None:
            lma.step(x, y)

        every = 1
    elif method == "adam":
        step = first_order.adam(model, loss, lr)
        every = 50
    elif method == "lbfgs":
        step = first_order.lbfgs(model, loss)
        every = 1
    else:
        step = _peer_step(model, x, y)
        every = 1
    reset_peak_rss()
    base = rss_mib()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) / 2**20
    out = _loop(step, model, grid, budget, every)
    if device.type == "cuda":
        # On a GPU the memory that matters is the device's: peak allocated over the start.
        out["memory_mib"] = torch.cuda.max_memory_allocated(device) / 2**20 - base
    else:
        out["memory_mib"] = peak_rss_mib() - base
    out["params"] = sum(p.numel() for p in model.parameters())
    out["rows"] = int(x.shape[0])
    if method == "ours":
        out["error_field"] = _field(model, device)
    return out


def _peer_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    import torch_levenberg_marquardt as tlm

    class Residuals(nn.Module):
        """The PINN as the peer takes it: inputs (point, group), outputs the residuals."""

        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            pts, tag = inp[:, :2], inp[:, 2]

            def u(p: torch.Tensor) -> torch.Tensor:
                return self.net(p.unsqueeze(0)).reshape(())

            lap = torch.func.vmap(lambda p: torch.func.hessian(u)(p).trace())(pts)
            value = torch.func.vmap(u)(pts)
            return torch.where(tag == 0, -lap - poisson_source(pts), value).unsqueeze(1)

    wrapped = Residuals(model)
    module = tlm.training.LevenbergMarquardtModule(wrapped, use_vmap=False, max_batch_size=256)
    inputs = torch.cat([x, y[:, :1]], 1)
    targets = torch.zeros(int(x.shape[0]), 1, dtype=x.dtype, device=x.device)

    def step() -> None:
        module.training_step(inputs, targets)

    return step


def _field(model: nn.Module, device: torch.device) -> list[list[float]]:
    g = torch.linspace(0, 1, 101, dtype=torch.float64)
    xx = torch.cartesian_prod(g, g).to(device)
    with torch.no_grad():
        err = (model(xx)[:, 0] - poisson_exact(xx)).reshape(101, 101)
    return err.cpu().tolist()


# -- the parent: children, rows, figures ------------------------------------------------------
def _child(quick: bool, device: str, method: str, budget: float, lr: float = 0.0) -> Any:
    """``run_method`` in a process of its own (in ``PEER_PYTHON``); None where it failed."""
    result, error = _child_process.call(
        "bench_pinn",
        "child",
        [method, budget, quick, device, lr],
        timeout=budget * 4 + 120,
        launcher=[str(PEER_PYTHON)],
    )
    if result is None:
        print(f"{method}: failed: {error}", flush=True)
    return result


def child(method: str, budget: float, quick: bool, device: str, lr: float) -> dict[str, Any]:
    """Inside a method's process: ``run_method`` on ``device`` with two threads."""
    setup_threads()
    return run_method(method, budget, quick, torch.device(device), lr)


def main(quick: bool = False, budget: float | None = None, device: str = "cpu") -> dict[str, Any]:
    """The comparison (each method in its own process); writes the JSON and the figures."""
    setup_threads()
    budget = budget or (10.0 if quick else 50.0)
    # The device's record (a GPU's names it): the report shows the CPU's step rows only
    # beside a CPU's results (``_pinn_report.summary``).
    info = _machine.describe(device)
    results: dict[str, Any] = {"machine": info, "budget_s": budget, "quick": quick}
    tuning = {}
    for lr in ADAM_RATES:
        r = _child(quick, device, "adam", budget / 4, lr)
        tuning[lr] = r["trace"][-1][1] if r else float("inf")
        print(f"adam lr={lr:g}: error {tuning[lr]:.3g} after {budget / 4:.0f} s", flush=True)
    best_lr = min(tuning, key=lambda k: tuning[k])
    results["adam_tuning"] = {str(k): v for k, v in tuning.items()}
    runs: dict[str, Any] = {}
    for method in ("ours", "lbfgs", "peer"):
        runs[method] = _child(quick, device, method, budget)
        if runs[method]:
            r = runs[method]
            print(
                f"{method}: error {r['trace'][-1][1]:.3g}, {r['steps']} steps, "
                f"step {r['step_median_s'] * 1e3:.1f} ms, memory {r['memory_mib']:.0f} MiB",
                flush=True,
            )
    runs["adam"] = _child(quick, device, "adam", budget, best_lr)
    results["adam_lr"] = best_lr
    results["runs"] = {
        k: {kk: vv for kk, vv in v.items() if kk != "error_field"} if v else None
        for k, v in runs.items()
    }

    if torch.device(device).type == "cpu":
        path, error = _child_process.call("_pinn_step", "main", [quick], timeout=900)
        print(f"the step by the Jacobian's path: {path or error}", flush=True)
        path, error = _child_process.call(
            "_pinn_engd", "main", [10.0 if quick else 60.0, 50, quick], timeout=900
        )
        print(f"ENGD's Poisson: {path or error}", flush=True)
    else:
        step, error = _child_process.call(
            "_pinn_engd", "device_steps", [device, STEP_REPEATS], timeout=STEP_TIMEOUT
        )
        results["pinn_step"] = step or {"error": error}
        print(f"PinnStep on {device}: {report.device_step_text(results['pinn_step'])}", flush=True)
    rows = report.run_rows(runs) + report.device_step_rows(results.get("pinn_step"))
    results["rows"] = [r.record() for r in rows]
    report.figures(runs, c.suffix(quick, device), results)
    return results


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick, budget=o.budget, device=o.device)


#: Its rows (recorded in its results) and its section of the report (``_pinn_report.py``).
rows = report.summary
section = report.section
