"""The PINN step by the Jacobian's path: the forward Laplacian (the default for ``Linear``
+ elementwise stacks) against the earlier path, ``torch.func.hessian`` at every point under
``vmap`` (``LMA(jacobian_mode="vmap")``), on the same problem, network and points.

Both sides start from the same weights and take their steps in turn (ours, then the
earlier one, ``steps`` times after one warm-up step each), so that the machine's load
falls on both alike; the figure is the ratio of the median step times. Beside it, the
Gram floor: NumPy's ``syrk`` of J's shape and one Cholesky factorisation, what every
dense step pays after its Jacobian whatever forms J. Shapes: the
Helmholtz problem of the PINN issue (a₂ = 4, 2-30-30-30-1, P = 1,981, 2,700 rows) and the
suite's Helmholtz, Burgers and Poisson at their own rows (``pinn_suite.py``).

Recorded in ``results/pinn_step.json``; ``bench_pinn.py``'s report shows it and adds its
rows (target: ≤ 0.3× the earlier step). In a process of its own::

    python benchmarks/_child.py _pinn_step main '[false]'     # true: the quick sizes
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

import _machine
import pinn_suite
import torch
from _common import setup_threads, suffix, write_json

from marquardt.solver import LMA

#: (label, problem, rows per group or None for the suite's own).
SHAPES: tuple[tuple[str, str, dict[str, int] | None], ...] = (
    ("helmholtz, 2,700 rows (the issue's shape)", "helmholtz", {"pde": 2300, "boundary": 400}),
    ("helmholtz (suite)", "helmholtz", None),
    ("burgers (suite)", "burgers", None),
    ("poisson (suite)", "poisson", None),
)
PATHS = {"forward Laplacian": "auto", "torch.func.hessian (earlier)": "vmap"}
TARGET = 0.3


def _gram_floor(rows: int, params: int, repeats: int) -> float:
    """Median seconds of the least any dense step of this shape pays after its Jacobian:
    NumPy's ``A.T @ A`` (its BLAS ``syrk``) of a float64 ``rows × params`` matrix and one
    Cholesky factorisation of the smaller side's system (``params`` or ``rows`` square)."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((rows, params))
    side = min(rows, params)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gram = a.T @ a if rows >= params else a @ a.T
        gram[np.diag_indices(side)] += 1.0
        torch.linalg.cholesky(torch.from_numpy(gram))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(label: str, name: str, rows: dict[str, int] | None, steps: int) -> dict[str, Any]:
    """Median step seconds of each path on one shape, the steps alternated."""
    problem = pinn_suite.problem(name)
    if rows is not None:
        problem = dataclasses.replace(problem, rows=rows)
    x, y = problem.batch(torch.Generator().manual_seed(0))
    solvers = {}
    for path, mode in PATHS.items():
        model = problem.network()
        solvers[path] = LMA(model, [torch.device("cpu")], problem.residual, jacobian_mode=mode)
        solvers[path].step(x, y)  # warm-up: the plan, the first chunk's buffers
    times: dict[str, list[float]] = {path: [] for path in PATHS}
    reports: dict[str, str] = {}
    for _ in range(steps):
        for path, lma in solvers.items():
            t0 = time.perf_counter()
            lma.step(x, y)
            times[path].append(time.perf_counter() - t0)
            report = lma.report
            assert report is not None
            reports[path] = f"{report.strategy}; J {report.seconds_jacobian * 1e3:.0f} ms, " + (
                f"assembly {report.seconds_assembly * 1e3:.0f} ms, "
                f"solve {report.seconds_solve * 1e3:.0f} ms"
            )
    params = sum(p.numel() for p in model.parameters())
    medians = {path: statistics.median(t) for path, t in times.items()}
    floor = _gram_floor(int(x.shape[0]), params, steps)
    ours, earlier = medians.values()
    out = {
        "label": label,
        "params": params,
        "rows": int(x.shape[0]),
        "steps": steps,
        "median_s": medians,
        "parts": reports,
        "ratio": ours / earlier,
        "gram_floor_s": floor,
    }
    print(
        f"{label:42s} P={params:6d} rows={x.shape[0]:5d}  "
        + "  ".join(f"{k} {v * 1e3:7.1f} ms" for k, v in medians.items())
        + f"  ratio {ours / earlier:.2f}  Gram floor {floor * 1e3:.1f} ms",
        flush=True,
    )
    return out


def main(quick: bool = False) -> str:
    """Measure every shape (two threads) and write ``results/pinn_step.json``; its path."""
    setup_threads()
    steps = 2 if quick else 7
    shapes = SHAPES[1:2] if quick else SHAPES
    result: dict[str, Any] = {
        "machine": _machine.describe(),
        "quick": quick,
        "target": TARGET,
        "load_before": _machine.load_average(),
        "shapes": [measure(label, name, rows, steps) for label, name, rows in shapes],
    }
    result["load_after"] = _machine.load_average()
    return str(write_json("pinn_step" + suffix(quick), result))
