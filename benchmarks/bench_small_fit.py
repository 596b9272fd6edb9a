"""Single small fits as a SciPy user runs them: ours against scipy.optimize.curve_fit.

The same data, p0 and float64 on every side; NumPy data in, as SciPy takes it:

* exponential decay a·exp(−b·x) + c (P = 3), N = 100, x in [0, 4];
* Gaussian plus offset (``bench_curve_fit``'s problem, P = 4), N = 10³, 10⁴, 10⁵, 10⁶.

Sides, interleaved, median of ``REPEATS`` calls from each side's tenth call on (the first
call of ours with a model it has not seen is timed apart, then ``WARM_CALLS`` more):

* SciPy: ``scipy.optimize.curve_fit(f, x, y, p0)`` with its defaults ("lm": MINPACK's
  lmdif, finite differences), f written with NumPy;
* ours, NumPy model: ``marquardt.solver.curve_fit`` with the same f (finite differences);
* ours, torch model: the same model written with torch operations (autodiff), with torch's
  default thread count, and again with one thread (the default must never be slower).

Targets, ours (tenth call on) / SciPy: ≤ 3× at N = 100, ≤ 1.5× at 10³, ≤ 1× at 10⁴,
≤ 0.5× from 10⁵ on; default threads / one thread ≤ 1. The first call is reported beside.
``python benchmarks/run_all.py small_fit [--quick] [--device cuda]`` (``cuda``: ours' torch-model side gets
its data on the GPU).
"""

from __future__ import annotations

import functools
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import _common as c
import _machine
import numpy as np
import torch
from _registry import Options
from _rows import Row, row

from marquardt.testing.problems import decay, decay_numpy, gaussian, gaussian_numpy

CASES = (
    ("decay", 100),
    ("gaussian", 1_000),
    ("gaussian", 10_000),
    ("gaussian", 100_000),
    ("gaussian", 1_000_000),
)
QUICK_CASES = (("decay", 100), ("gaussian", 1_000), ("gaussian", 10_000))
REPEATS = 5
QUICK_REPEATS = 3
TARGETS = {100: 3.0, 1_000: 1.5, 10_000: 1.0}
TARGET_LARGE = 0.5
THREADS_TARGET = 1.0
#: Calls of each side after the first and before the timed ones (timing starts at the tenth).
WARM_CALLS = 8

DECAY_TRUE, DECAY_P0 = (2.5, 1.3, 0.5), (1.0, 1.0, 0.0)
GAUSS_TRUE, GAUSS_P0 = (2.0, 0.3, 0.8, 0.5), (1.0, 0.0, 1.0, 0.0)


def problem(
    name: str, n: int
) -> tuple[Callable[..., Any], Callable[..., Any], np.ndarray, np.ndarray, tuple[float, ...]]:
    rng = np.random.default_rng(c.SEED)
    if name == "decay":
        x = np.linspace(0.0, 4.0, n)
        y = decay_numpy(x, *DECAY_TRUE) + 0.02 * rng.standard_normal(n)
        return decay_numpy, decay, x, y, DECAY_P0
    x = np.linspace(-5.0, 5.0, n)
    y = gaussian_numpy(x, *GAUSS_TRUE) + 0.05 * rng.standard_normal(n)
    return gaussian_numpy, gaussian, x, y, GAUSS_P0


def _timed(call: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def _fresh(f: Callable[..., Any]) -> Callable[..., Any]:
    """A new function object that calls ``f``: a model no cache has seen (same signature)."""

    @functools.wraps(f)
    def model(*args: Any) -> Any:
        return f(*args)

    return model


def measure(name: str, n: int, repeats: int, device: torch.device) -> dict[str, Any]:
    from scipy.optimize import curve_fit as scipy_curve_fit

    from marquardt.solver import curve_fit

    f_np, f_t, x, y, p0 = problem(name, n)
    f_np, f_t = _fresh(f_np), _fresh(f_t)
    default_threads = torch.get_num_threads()
    xt, yt = (torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
    torch_x, torch_y = (x, y) if device.type == "cpu" else (xt, yt)

    def as_numpy(p: Any) -> np.ndarray:
        return p.cpu().numpy() if isinstance(p, torch.Tensor) else np.asarray(p)

    def scipy() -> np.ndarray:
        return scipy_curve_fit(f_np, x, y, list(p0))[0]

    def ours_numpy() -> np.ndarray:
        return curve_fit(f_np, x, y, list(p0))[0]

    def ours_torch() -> np.ndarray:
        out = as_numpy(curve_fit(f_t, torch_x, torch_y, list(p0))[0])
        c.synchronize(device)
        return out

    def ours_torch_one_thread() -> np.ndarray:
        torch.set_num_threads(1)
        try:
            return ours_torch()
        finally:
            torch.set_num_threads(default_threads)

    sides = {
        "scipy": scipy,
        "ours_numpy_model": ours_numpy,
        "ours_torch_model": ours_torch,
        "ours_torch_model_1_thread": ours_torch_one_thread,
    }
    load_before = _machine.load_average()
    seconds: dict[str, list[float]] = {k: [] for k in sides}
    popt: dict[str, list[float]] = {}
    first: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, call in sides.items():
            first[key] = _timed(call)[0]
        for _ in range(WARM_CALLS):
            for call in sides.values():
                call()
        for _ in range(repeats):
            for key, call in sides.items():
                t, p = _timed(call)
                seconds[key].append(t)
                popt[key] = [float(v) for v in p]
    med = {k: statistics.median(v) for k, v in seconds.items()}
    ref = np.asarray(popt["scipy"])
    agreement = {
        k: float(np.max(np.abs(np.asarray(v) - ref) / np.abs(ref))) for k, v in popt.items()
    }
    return {
        "case": name,
        "n": n,
        "repeats": repeats,
        "median": med,
        "first_call": first,
        "ratios": {
            "numpy_model_vs_scipy": med["ours_numpy_model"] / med["scipy"],
            "torch_model_vs_scipy": med["ours_torch_model"] / med["scipy"],
            "default_vs_one_thread": med["ours_torch_model"] / med["ours_torch_model_1_thread"],
        },
        "max_relative_popt_difference_to_scipy": agreement,
        "threads_default": default_threads,
        "load_before": load_before,
        "load_after": _machine.load_average(),
    }


def main(quick: bool = False, device: str = "cpu") -> dict[str, Any]:
    where = torch.device(device)
    results: dict[str, Any] = {
        "problem": "single fits, float64, NumPy data in; decay a·exp(−b·x) + c (P = 3) and "
        "Gaussian plus offset (P = 4)",
        "device": str(where),
        "quick": quick,
        "machine": {k: v for k, v in _machine.describe().items() if k in ("cpu", "cores", "torch")},
        "cases": [],
    }
    for name, n in QUICK_CASES if quick else CASES:
        results["cases"].append(measure(name, n, QUICK_REPEATS if quick else REPEATS, where))
    return results


def _ms(value: float) -> str:
    """A duration in milliseconds with the digits a sub-millisecond fit needs."""
    return f"{value * 1e3:.3g} ms"


def _first(first: dict[str, float], key: str, label: str = "") -> str:
    """`` (first call …)`` of a side, or "" for a record without first calls."""
    return f" ({label}{_ms(first[key])})" if key in first else ""


def _target(n: int) -> float:
    return TARGETS.get(n, TARGET_LARGE)


def rows(results: dict[str, Any]) -> list[Row]:
    """Per case: each model's tenth call over SciPy's, and default threads over one."""
    rows = []
    for e in results["cases"]:
        med, r = e["median"], e["ratios"]
        first = e.get("first_call", {})
        label = f"small fit {e['case']} N={e['n']:,}"
        load = f"load {e['load_before']:.1f} → {e['load_after']:.1f}"
        for model, kind in (("NumPy", "numpy"), ("torch", "torch")):
            side = f"ours_{kind}_model"
            rows.append(
                row(
                    f"{label}: ours ({model} model, tenth call) / SciPy",
                    r[f"{kind}_model_vs_scipy"],
                    _target(e["n"]),
                    detail=f"ours {_ms(med[side])}{_first(first, side, 'first call ')}, "
                    f"SciPy {_ms(med['scipy'])}; {load}",
                )
            )
        rows.append(
            row(
                f"{label}: torch model, {e['threads_default']} threads / 1 thread",
                r["default_vs_one_thread"],
                THREADS_TARGET,
                detail=f"{_ms(med['ours_torch_model'])} against "
                f"{_ms(med['ours_torch_model_1_thread'])}",
            )
        )
    return rows


def section(results: dict[str, Any]) -> str:
    out = [
        f"{results['problem']}; device {results['device']}. SciPy: curve_fit(f, x, y, p0) "
        "defaults ('lm'); ours: marquardt.solver.curve_fit with the same f (NumPy model, "
        "finite differences) and with f in torch (autodiff), default threads and one thread. "
        f"Interleaved calls from each side's tenth on, medians (first call: a model ours has "
        f"not seen, in a process that has fitted before).",
        "",
        "| case | N | SciPy | ours, NumPy model (first call) | ours, torch model (first call) "
        "| torch, 1 thread | NumPy / SciPy | torch / SciPy | max rel. popt diff | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in results["cases"]:
        med, r = e["median"], e["ratios"]
        first = e.get("first_call", {})
        diff = max(e["max_relative_popt_difference_to_scipy"].values())
        out.append(
            f"| {e['case']} | {e['n']:,} | {_ms(med['scipy'])} | "
            f"{_ms(med['ours_numpy_model'])}{_first(first, 'ours_numpy_model')} | "
            f"{_ms(med['ours_torch_model'])}{_first(first, 'ours_torch_model')} | "
            f"{_ms(med['ours_torch_model_1_thread'])} | "
            f"{r['numpy_model_vs_scipy']:.2f}× | {r['torch_model_vs_scipy']:.2f}× | {diff:.1e} | "
            f"{e['load_before']:.1f} → {e['load_after']:.1f} |"
        )
    return "\n".join(out)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick, device=o.device)
