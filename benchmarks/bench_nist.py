"""The NIST StRD nonlinear-regression problems from both starts: digits against SciPy's.

The 27 problems of NIST's Statistical Reference Datasets (https://www.itl.nist.gov/div898/
strd/nls/; data, starts and certified values read from NIST's files in
``marquardt.testing``'s ``nist_data``, see ``packages/testing``), each from NIST's
start 1 (far) and start 2 (near): 54 fits, float64 on the CPU, one torch thread. A fit's
LRE is the min over its parameters of −log₁₀(|p − c|/|c|) against NIST's certified values
(capped at 11, the certified digits; 0 for an error or a non-finite result); a fit counts
as right at LRE ≥ 6 (``RIGHT_FROM``) and at a wrong point below 2 (``WRONG_BELOW``).

Sides, each fit like for like:

* SciPy's defaults: ``marquardt.solver.curve_fit(f, x, y, p0)`` (f written with torch)
  against ``scipy.optimize.curve_fit(f, x, y, p0)`` (f through NumPy: MINPACK's lmdif,
  J by differences);
* tight: both with ftol = xtol = gtol = 1e-15 and 100,000 evaluations, ours against
  MINPACK through ``scipy.optimize.least_squares(method="lm")`` (J by differences);
* ``curve_fit_batch``: each problem as one batch of its two starts (float64, compile off),
  at its defaults and tight, against the same SciPy sides;
* ``curve_fit_result`` (``LMA``) with its defaults, for information.

The time rows: a small fit's seconds per trial on the ``"lm"`` path against the
``"trf"`` path (the Gram solve and Nielsen's λ that ``"lm"`` took before; the same
differences and J), and one iteration's damped solve of the small-fit path
(``_curve.single_lm.trust``: the scaled J's decomposition, then the trust region's λ and
step) against the solve it replaced (JᵀJ + λD², its scaled eigenvalues, one P × P
solve) at small-fit shapes (N × P); medians of interleaved calls. ``python
benchmarks/run_all.py nist [--quick]`` (``--quick``: start 1 of the higher-difficulty
problems only).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import _machine
import numpy as np
import torch
from _registry import Options
from _rows import row

from marquardt.testing import nist as nist_strd

#: LRE from which a fit is right, and below which it ended at a wrong point.
RIGHT_FROM = 6.0
WRONG_BELOW = 2.0
#: SciPy's tight tolerances of the issue: ftol = xtol = gtol, and the evaluations.
TIGHT = {"ftol": 1e-15, "xtol": 1e-15, "gtol": 1e-15}
TIGHT_NFEV = 100_000
#: A fit a digit or more behind SciPy's.
BEHIND = 1.0
#: Small-fit shapes (N, P) of the time row, and the repeats of each solve.
SOLVE_SHAPES = ((100, 3), (1000, 5), (250, 7), (10_000, 10))
SOLVE_REPEATS = 200
#: Points of the whole-fit time row, and its repeats.
FIT_POINTS = (100, 1000, 10_000)
FIT_REPEATS = 20


def _numpy_model(problem: nist_strd.NistProblem) -> Any:
    """f(x, *b) with NumPy arrays, through the torch model (float64, no autodiff)."""

    def f(x: np.ndarray, *b: float) -> np.ndarray:
        with torch.no_grad():
            out = problem.f(torch.from_numpy(np.asarray(x)), *torch.tensor(b, dtype=torch.float64))
        return out.numpy()

    return f


def _quiet(call: Any) -> tuple[Any, float, str]:
    """(call's result or None, seconds, error text)."""
    t = time.perf_counter()
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            out, error = call(), ""
    except Exception as exc:  # a failed fit is a result here, not a crash
        out, error = None, repr(exc)[:200]
    return out, time.perf_counter() - t, error


def _lre(problem: nist_strd.NistProblem, popt: Any) -> float:
    return 0.0 if popt is None else nist_strd.lre(np.asarray(popt, float), problem.certified)


def single_fits(problem: nist_strd.NistProblem, start: int) -> dict[str, Any]:
    """One start's fits: ours and SciPy's at SciPy's defaults and tight, and ``LMA``."""
    from scipy.optimize import curve_fit as scipy_curve_fit
    from scipy.optimize import least_squares

    from marquardt.solver import curve_fit, curve_fit_result

    p0 = np.array(problem.starts[start - 1])
    x, y, f = problem.x.numpy(), problem.y.numpy(), _numpy_model(problem)
    tight = {**TIGHT, "maxfev": TIGHT_NFEV}
    sides = {
        "ours": lambda: curve_fit(problem.f, problem.x, problem.y, torch.tensor(p0))[0],
        "scipy": lambda: scipy_curve_fit(f, x, y, p0)[0],
        "ours_tight": lambda: curve_fit(problem.f, problem.x, problem.y, torch.tensor(p0), **tight)[
            0
        ],
        "minpack_tight": lambda: (
            least_squares(lambda b: f(x, *b) - y, p0, method="lm", max_nfev=TIGHT_NFEV, **TIGHT).x
        ),
        "lma": lambda: curve_fit_result(problem.f, problem.x, problem.y, torch.tensor(p0)).popt,
    }
    out: dict[str, Any] = {}
    for name, call in sides.items():
        popt, seconds, error = _quiet(call)
        out[name] = {"lre": _lre(problem, popt), "seconds": seconds, "error": error}
    return out


def batch_fits(problem: nist_strd.NistProblem, starts: tuple[int, ...]) -> dict[str, list[float]]:
    """LREs of ``curve_fit_batch`` over the problem's starts as one batch, at its defaults
    and tight."""
    from marquardt.solver import curve_fit_batch

    y = problem.y.expand(len(starts), -1).clone()
    p0 = torch.tensor([problem.starts[s - 1] for s in starts], dtype=torch.float64)
    # A (k, N) x is given per fit, (M, k, N): with k = M a shared one reads as per fit.
    x = problem.x if problem.x.ndim == 1 else problem.x.expand(len(starts), -1, -1).clone()
    out = {}
    for name, options in (
        ("batch", {}),
        ("batch_tight", {**TIGHT, "max_nfev": TIGHT_NFEV}),
    ):
        popt, _, _ = _quiet(
            lambda o=options: curve_fit_batch(problem.f, x, y, p0, compile=False, **o)[0]
        )
        out[name] = [_lre(problem, None if popt is None else popt[k]) for k in range(len(starts))]
    return out


def _old_solve(js: np.ndarray, g: np.ndarray, d: np.ndarray, lam: float) -> np.ndarray:
    """The replaced solve: JᵀJ, its scaled eigenvalues (the conditioning test), one solve."""
    gram = js.T @ js
    np.linalg.eigvalsh(gram / np.outer(d, d))
    return np.asarray(np.linalg.solve(gram + np.diag(lam * d**2), g))


def _new_solve(js: np.ndarray, r: np.ndarray, d: np.ndarray, radius: float) -> np.ndarray:
    """The trust region's: the scaled J's decomposition, then λ for the radius and the step."""
    from marquardt.solver._curve.single_lm import trust

    dec = trust.decompose(js, d, r, js.T @ r)
    return trust.step_for_radius(dec, radius, 0.0)[0] / d


def solve_times() -> list[dict[str, Any]]:
    """Median seconds of the old and the new solve per shape, interleaved."""
    rng = np.random.default_rng(0)
    out = []
    for n, p in SOLVE_SHAPES:
        js = rng.standard_normal((n, p)) * np.logspace(0, 3, p)
        r = rng.standard_normal(n)
        d = np.sqrt((js * js).sum(0))
        # A radius a third of the Gauss-Newton step's: a damped step, as in most iterations.
        radius = float(np.linalg.norm(d * np.linalg.lstsq(js, r, rcond=None)[0])) / 3
        old, new = [], []
        for _ in range(SOLVE_REPEATS):
            t = time.perf_counter()
            _old_solve(js, js.T @ r, d, 1e-3)
            old.append(time.perf_counter() - t)
            t = time.perf_counter()
            _new_solve(js, r, d, radius)
            new.append(time.perf_counter() - t)
        out.append({"n": n, "p": p, "old_s": float(np.median(old)), "new_s": float(np.median(new))})
    return out


def _decay(x: np.ndarray, a: float, k: float, c: float) -> np.ndarray:
    return np.asarray(a * np.exp(-k * x) + c)


def fit_times() -> list[dict[str, Any]]:
    """Seconds per LM trial of a whole small fit (a NumPy decay, SciPy's defaults) on the
    "lm" path (the trust region) and on the "trf" path (the Gram solve it replaced for
    "lm", with the same differences and the same tests but λ's rule): medians of
    ``FIT_REPEATS`` interleaved calls, each divided by its trials."""
    from marquardt.solver import curve_fit

    rng = np.random.default_rng(1)
    out = []
    for n in FIT_POINTS:
        x = np.linspace(0.0, 4.0, n)
        y = _decay(x, 2.5, 1.3, 0.5) + 0.05 * rng.standard_normal(n)
        per: dict[str, list[float]] = {"lm": [], "trf": []}
        for _ in range(FIT_REPEATS):
            for method in per:
                t = time.perf_counter()
                info = curve_fit(_decay, x, y, [1.0, 1.0, 0.0], method=method, full_output=True)[2]
                per[method].append((time.perf_counter() - t) / info["nfev"])
        out.append(
            {"n": n, "new_s": float(np.median(per["lm"])), "old_s": float(np.median(per["trf"]))}
        )
    return out


def fits(quick: bool = False) -> dict[str, Any]:
    """Every fit; the totals; the solve times."""
    problems = nist_strd.nist_problems()
    if quick:
        problems = tuple(p for p in problems if p.difficulty == "higher")
    starts = (1,) if quick else (1, 2)
    single_fits(problems[0], 2)  # warm-up: torch's functorch starts on the first call
    batch_fits(problems[0], starts)
    load_before = _machine.load_average()
    fits = []
    for problem in problems:
        batch = batch_fits(problem, starts)
        for k, start in enumerate(starts):
            record = {"problem": problem.name, "difficulty": problem.difficulty, "start": start}
            record.update(single_fits(problem, start))
            record["batch"] = {"lre": batch["batch"][k]}
            record["batch_tight"] = {"lre": batch["batch_tight"][k]}
            fits.append(record)
    times = solve_times()
    per_trial = fit_times()
    return {
        "config": "marquardt.solver.curve_fit(f, x, y, p0) and curve_fit_batch (each problem's "
        "starts as one batch) vs scipy.optimize.curve_fit defaults; tight (ftol = xtol = gtol "
        f"= 1e-15, {TIGHT_NFEV} evaluations) vs least_squares(method='lm'); float64, CPU, "
        f"{torch.get_num_threads()} torch thread(s)",
        "quick": quick,
        "load_before": load_before,
        "load_after": _machine.load_average(),
        "fits": fits,
        "solve_times": times,
        "fit_times": per_trial,
        "totals": totals(fits),
    }


#: (our side, SciPy's side) of each comparison.
PAIRS = {
    "defaults": ("ours", "scipy"),
    "tight": ("ours_tight", "minpack_tight"),
    "batch defaults": ("batch", "scipy"),
    "batch tight": ("batch_tight", "minpack_tight"),
}


def totals(fits: list[dict[str, Any]]) -> dict[str, Any]:
    """Per comparison: each side's count of right fits, ours a digit or more behind, ours at
    a wrong point where SciPy's is not."""
    out: dict[str, Any] = {"fits": len(fits)}
    for name, (mine, theirs) in PAIRS.items():
        out[name] = {
            "ours": sum(f[mine]["lre"] >= RIGHT_FROM for f in fits),
            "scipy": sum(f[theirs]["lre"] >= RIGHT_FROM for f in fits),
            "behind": [
                f"{f['problem']} {f['start']} ({f[mine]['lre']:.1f} vs {f[theirs]['lre']:.1f})"
                for f in fits
                if f[mine]["lre"] <= f[theirs]["lre"] - BEHIND
            ],
            "wrong": [
                f"{f['problem']} {f['start']}"
                for f in fits
                if f[mine]["lre"] < WRONG_BELOW <= f[theirs]["lre"]
            ],
        }
    out["lma"] = sum(f["lma"]["lre"] >= RIGHT_FROM for f in fits)
    return out


def main(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    results = fits(quick=quick)
    results["machine"] = _machine.describe()["cpu"]
    return results


def rows(results: dict[str, Any]) -> list[Any]:
    """Right fits against SciPy's count (targets: defaults ≥ SciPy's with at most 2 fits a
    digit behind; tight ≥ MINPACK's and ≥ 52 of 54 with no fit at a wrong point where
    MINPACK is right; the batch the same), and the solve's time per iteration (≤ 1.2×)."""
    t = results["totals"]
    n = t["fits"]
    out = []
    for name in PAIRS:
        c = t[name]
        peer = "SciPy curve_fit" if "defaults" in name else "MINPACK (least_squares lm)"
        detail = (
            f"{peer} {c['scipy']}; a digit or more behind: {', '.join(c['behind']) or 'none'}; "
            f"at a wrong point: {', '.join(c['wrong']) or 'none'}"
        )
        what = f"nist: fits with LRE ≥ 6 ({name}, of {n})"
        out.append(row(what, float(c["ours"]), float(c["scipy"]), op="≥", unit="", detail=detail))
        if "tight" in name:
            out.append(
                row(
                    f"nist: fits with LRE ≥ 6 ({name}) of the goal {n}",
                    float(c["ours"]),
                    n * 52 / 54,
                    op="≥",
                    unit="",
                    detail="target 52 of 54; every fit the goal",
                )
            )
        limit = 2.0 if "defaults" in name else 0.0
        key = "behind" if "defaults" in name else "wrong"
        out.append(
            row(
                f"nist: fits {'a digit behind SciPy' if key == 'behind' else 'at a wrong point'}"
                f" ({name})",
                float(len(c[key])),
                limit,
                unit="",
                detail=", ".join(c[key]) or "none",
            )
        )
    for s in results["solve_times"]:
        out.append(
            row(
                f"nist: damped solve per iteration, N = {s['n']}, P = {s['p']}",
                s["new_s"] / s["old_s"],
                1.2,
                detail=f"SVD + trust region {s['new_s'] * 1e6:.0f} µs vs Gram solve "
                f"{s['old_s'] * 1e6:.0f} µs (median of {SOLVE_REPEATS})",
            )
        )
    for s in results.get("fit_times", []):
        out.append(
            row(
                f"nist: a small fit's time per trial, N = {s['n']}, P = 3 (lm / trf path)",
                s["new_s"] / s["old_s"],
                1.2,
                detail=f"NumPy decay, SciPy's defaults: trust region {s['new_s'] * 1e6:.0f} µs vs "
                f"the Gram solve's path {s['old_s'] * 1e6:.0f} µs a trial (median of {FIT_REPEATS})",
            )
        )
    return out


def section(results: dict[str, Any]) -> str:
    """The RESULTS.md section: the counts and one line per fit."""
    t = results["totals"]
    out = [
        f"{results['config']}; load {results['load_before']:.1f} → {results['load_after']:.1f}. "
        f"LRE: correct significant digits against NIST's certified parameters (capped at 11); "
        f"right from {RIGHT_FROM:g}, a wrong point below {WRONG_BELOW:g}.",
        "",
        "| comparison | ours right | SciPy right | ours ≥ 1 digit behind | ours wrong, SciPy not |",
        "|---|---|---|---|---|",
    ]
    for name in PAIRS:
        c = t[name]
        out.append(
            f"| {name} | {c['ours']} | {c['scipy']} | {', '.join(c['behind']) or 'none'} | "
            f"{', '.join(c['wrong']) or 'none'} |"
        )
    out += [
        "",
        f"`curve_fit_result` (`LMA`) with its defaults: {t['lma']} right.",
        "",
        "| problem | difficulty | start | ours | SciPy | ours tight | MINPACK tight | "
        "batch | batch tight | LMA |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in results["fits"]:
        cells = " | ".join(
            f"{f[k]['lre']:.1f}"
            for k in ("ours", "scipy", "ours_tight", "minpack_tight", "batch", "batch_tight", "lma")
        )
        out.append(f"| {f['problem']} | {f['difficulty']} | {f['start']} | {cells} |")
    return "\n".join(out)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick)
