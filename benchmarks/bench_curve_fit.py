"""curve_fit at the sizes measurements bring: ours against scipy.optimize.curve_fit.

Problem: a Gaussian plus offset, ``y = a·exp(−½((x − μ)/s)²) + c`` (P = 4), on N points
``x`` evenly spaced in [−5, 5], generated at (a, μ, s, c) = (2, 0.3, 0.8, 0.5) with
Gaussian noise of σ = 0.05 (seeded), fitted from p0 = (1, 0, 1, 0), float64, at
N = 10⁴, 10⁵, 10⁶, 10⁷.

Sides, timed interleaved (ours, lm, trf, ours, …) so that they share the load:

* ours: ``marquardt.solver.curve_fit(f, x, y, p0)`` with its defaults, f written with
  torch operations, on ``--device`` (the CPU here), with ``OURS_THREADS`` = 1 torch
  thread: its work is element-wise on chunks of 2¹⁶ points that stay in cache, where a
  second OpenMP thread gains little on an idle machine and costs much on a busy one (each
  operation ends at a barrier: one Jacobian pass at N = 10⁶ took 412 ms with 2 threads
  and 24.5 ms with 1 at a load average of 6.6 on these 2 cores; the whole fit 28.6 s
  against 1.1 s). NumPy's element-wise work on SciPy's side is single-threaded too;
* SciPy ``curve_fit(..., method="lm")`` (MINPACK's lmdif) and ``method="trf"``, with
  their defaults, f written with NumPy — as users call them (Jacobian by finite
  differences, since curve_fit users rarely write one).

Wall time is the whole call (to convergence: each side's own stopping tests). Repeats:
``REPEATS`` per N (3 at N ≤ 10⁶, 1 at 10⁷), after one untimed warm-up call of each side at
N = 10⁴ (ours pays a one-time start of about a second for torch's functorch on its first
call in a process; it is reported apart, as ``first_call_seconds``). Medians.

Accuracy: the LRE (log relative error, the number of correct significant digits,
McCullough 1998) of each side's parameters against a reference fit: SciPy's
``least_squares(method="lm")`` with the exact Jacobian and ftol = xtol = gtol = 1e-15 on
the same data, then Gauss-Newton steps with the exact Jacobian (NumPy's ``lstsq``) until a
step is below 1e-15 relative (MINPACK alone stops up to ~1e-8 relative from the stationary
point where the cost is flat: measured at N = 500, its Gauss-Newton step was 3.7e-9); LRE = −log₁₀ max_j |p_j − p̂_j|/|p̂_j|, capped at 15.

Target: ours ≤ 0.5× SciPy's time (the faster of lm and trf) at N ≥ 10⁶.
``python benchmarks/run_all.py curve_fit [--quick] [--device cuda]`` (on a GPU the target holds at every N).
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from typing import Any

import _common as c
import _machine
import numpy as np
import torch
from _registry import Options
from _rows import Row, row

from marquardt.testing.problems import gaussian, gaussian_numpy

SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
QUICK_SIZES = (2_000, 20_000)
OURS_THREADS = 1
REPEATS = {10_000: 3, 100_000: 3, 1_000_000: 3, 10_000_000: 1}
TRUE = (2.0, 0.3, 0.8, 0.5)
P0 = (1.0, 0.0, 1.0, 0.0)
NOISE = 0.05
TARGET = 0.5
TARGET_FROM = 1_000_000
LRE_CAP = 15.0
REFINE_STEPS = 5


def data(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The N points of the problem (the same for every side)."""
    rng = np.random.default_rng(c.SEED)
    x = np.linspace(-5.0, 5.0, n)
    return x, gaussian_numpy(x, *TRUE) + NOISE * rng.standard_normal(n)


def reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The reference parameters: MINPACK's lmder with the exact Jacobian, tolerances 1e-15."""
    from scipy.optimize import least_squares

    def residuals(p: np.ndarray) -> np.ndarray:
        return gaussian_numpy(x, *p) - y

    def jacobian(p: np.ndarray) -> np.ndarray:
        a, mu, s, _ = p
        z = (x - mu) / s
        e = np.exp(-0.5 * z * z)
        return np.stack([e, a * e * z / s, a * e * z * z / s, np.ones_like(x)], axis=1)

    fit = least_squares(
        residuals, np.array(P0), jac=jacobian, method="lm", ftol=1e-15, xtol=1e-15, gtol=1e-15
    )
    p = np.asarray(fit.x)
    # MINPACK stops when the cost no longer changes in double precision, which leaves p̂
    # up to ~1e-8 relative off where the optimum is flat; Gauss-Newton steps (least
    # squares with the exact J) remove that, down to the rounding of the step itself.
    for _ in range(REFINE_STEPS):
        step = np.linalg.lstsq(jacobian(p), residuals(p), rcond=None)[0]
        p = p - step
        if np.all(np.abs(step) <= 1e-15 * np.abs(p)):
            break
    return p


def lre(p: np.ndarray, ref: np.ndarray) -> float:
    """Correct significant digits of ``p`` against ``ref`` (capped at ``LRE_CAP``)."""
    err = float(np.max(np.abs(p - ref) / np.abs(ref)))
    return LRE_CAP if err == 0.0 else min(LRE_CAP, -math.log10(err))


def _sides(x: np.ndarray, y: np.ndarray, device: torch.device) -> dict[str, tuple[Any, Any]]:
    """name → (call returning p̂ as NumPy, synchronise)."""
    from scipy.optimize import curve_fit as scipy_curve_fit

    from marquardt.solver import curve_fit

    xt = torch.from_numpy(x).to(device)
    yt = torch.from_numpy(y).to(device)

    def ours() -> np.ndarray:
        popt, _ = curve_fit(gaussian, xt, yt, list(P0))
        return popt.cpu().numpy()

    def scipy(method: str) -> Any:
        def call() -> np.ndarray:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                popt, _ = scipy_curve_fit(gaussian_numpy, x, y, p0=P0, method=method)
            return np.asarray(popt)

        return call

    sync = (lambda: c.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return {
        "ours": (ours, sync),
        "lm": (scipy("lm"), lambda: None),
        "trf": (scipy("trf"), lambda: None),
    }


def measure(n: int, repeats: int, device: torch.device) -> dict[str, Any]:
    """Interleaved timings of the three sides at N = n, their LREs and the load."""
    x, y = data(n)
    load_before = _machine.load_average()
    ref = reference(x, y)
    sides = _sides(x, y, device)
    seconds: dict[str, list[float]] = {k: [] for k in sides}
    popt: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, (call, sync) in sides.items():
            sync()
            start = time.perf_counter()
            popt[name] = call()
            sync()
            seconds[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    best_scipy = min(med["lm"], med["trf"])
    return {
        "n": n,
        "repeats": repeats,
        "seconds": seconds,
        "median": med,
        "lre": {k: lre(p, ref) for k, p in popt.items()},
        "reference": ref.tolist(),
        "ratios": {
            "ours_vs_lm": med["ours"] / med["lm"],
            "ours_vs_trf": med["ours"] / med["trf"],
            "ours_vs_best_scipy": med["ours"] / best_scipy,
        },
        "load_before": load_before,
        "load_after": _machine.load_average(),
    }


def first_call(device: torch.device) -> float:
    """Seconds of ours' first call in this process (N = 10⁴), one-time costs included."""
    x, y = data(10_000)
    sides = _sides(x, y, device)
    start = time.perf_counter()
    sides["ours"][0]()
    seconds = time.perf_counter() - start
    for call, _ in sides.values():  # the warm-up of every side
        call()
    return seconds


def main(quick: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Every size with ours on ``device`` and SciPy on the host; on a GPU the target holds
    at every N, on the CPU from ``TARGET_FROM`` points."""
    torch.set_num_threads(OURS_THREADS)
    where = torch.device(device)
    target_from = 0 if where.type == "cuda" else TARGET_FROM
    sizes = QUICK_SIZES if quick else SIZES
    results: dict[str, Any] = {
        "problem": "Gaussian plus offset a·exp(−½((x−μ)/s)²) + c (P = 4), x in [−5, 5], "
        f"true {TRUE}, noise σ = {NOISE}, p0 = {P0}, float64, {torch.get_num_threads()} "
        "torch thread(s), "
        f"device {where}",
        "ours_config": "marquardt.solver.curve_fit(f, x, y, p0) with its defaults",
        "scipy_config": "scipy.optimize.curve_fit(f, x, y, p0, method='lm' | 'trf'), "
        "defaults (finite-difference Jacobian)",
        "reference": "least_squares(method='lm', exact Jacobian, ftol=xtol=gtol=1e-15) "
        "refined by Gauss-Newton steps (exact Jacobian) to a step below 1e-15",
        "target": TARGET,
        "target_from": target_from,
        "quick": quick,
        "first_call_seconds": first_call(where),
        "sizes": {},
    }
    for n in sizes:
        results["sizes"][str(n)] = measure(n, 1 if quick else REPEATS.get(n, 3), where)
    return results


def rows(results: dict[str, Any]) -> list[Row]:
    """The ratios with their targets, for the aggregate table."""
    rows = []
    for e in results["sizes"].values():
        med, lres = e["median"], e["lre"]
        target = results["target"] if e["n"] >= results["target_from"] else None
        detail = (
            f"ours {c.seconds_text(med['ours'])}, lm {c.seconds_text(med['lm'])}, trf {c.seconds_text(med['trf'])} (medians of "
            f"{e['repeats']}); LRE ours {lres['ours']:.1f}, lm {lres['lm']:.1f}, trf "
            f"{lres['trf']:.1f}; load {e['load_before']:.1f} → {e['load_after']:.1f}"
        )
        rows.append(
            row(
                f"curve_fit N={e['n']:,}: ours / best SciPy",
                e["ratios"]["ours_vs_best_scipy"],
                target,
                detail=detail,
            )
        )
    return rows


def section(results: dict[str, Any]) -> str:
    """The RESULTS.md section."""
    out = [
        f"{results['problem']}. Ours: {results['ours_config']}; SciPy: "
        f"{results['scipy_config']}. Interleaved calls, medians; LRE against "
        f"{results['reference']}. Ours' first call in a process (one-time start of torch's "
        f"functorch included): {c.seconds_text(results['first_call_seconds'])} at N = 10,000.",
        "",
        "| N | repeats | ours | SciPy lm | SciPy trf | ours / lm | ours / trf | "
        "LRE ours / lm / trf | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in results["sizes"].values():
        med, r, lres = e["median"], e["ratios"], e["lre"]
        out.append(
            f"| {e['n']:,} | {e['repeats']} | {c.seconds_text(med['ours'])} | {c.seconds_text(med['lm'])} | "
            f"{c.seconds_text(med['trf'])} | {r['ours_vs_lm']:.2f}× | {r['ours_vs_trf']:.2f}× | "
            f"{lres['ours']:.1f} / {lres['lm']:.1f} / {lres['trf']:.1f} | "
            f"{e['load_before']:.1f} → {e['load_after']:.1f} |"
        )
    return "\n".join(out)


def echo(results: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    print(results["problem"])
    print(f"  first call of ours in this process: {c.seconds_text(results['first_call_seconds'])}")
    print(section(results))


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick, device=o.device)
