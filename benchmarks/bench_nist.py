"""The NIST StRD nonlinear-regression problems from both starts: ours against SciPy's lm.

The 27 problems of NIST's Statistical Reference Datasets (https://www.itl.nist.gov/div898/
strd/nls/; data, starts and certified values read from NIST's files in
``marquardt.testing``'s ``nist_data``, see ``packages/testing``), each from NIST's
start 1 (far) and start 2 (near): 54 fits, float64 on the CPU.

Sides, run one after the other on each fit:

* ours: ``marquardt.solver.curve_fit_result(f, x, y, p0)`` with its defaults,
  f written with torch operations;
* SciPy: ``scipy.optimize.curve_fit(f, x, y, p0, method="lm", full_output=True)`` with its
  defaults (MINPACK's lmdif, Jacobian by finite differences), f written with NumPy.

Recorded per fit: the LRE of the parameters against NIST's certified values (min over the
parameters of −log₁₀(|p − c|/|c|), capped at 11, the certified digits; 0 for an error or a
non-finite result), our LM steps, SciPy's function evaluations, and each side's seconds
(one call each, after a warm-up fit: for information, the figures of interest are the
accuracy and the steps). A fit "fails" below LRE 4 (NIST's and McCullough's threshold for
an acceptable answer on these problems).

``main``'s ``lma`` overrides the options ``curve_fit`` hands to ``LMA``, to measure a
candidate default: ``python benchmarks/_child.py bench_nist main '[false, {"geodesic":
0.75}]'``. ``python benchmarks/run_all.py nist [--quick]`` (``--quick``: start 1 of the higher-
difficulty problems only).
"""

from __future__ import annotations

import ast
import math
import time
import warnings
from typing import Any

import _machine
import numpy as np
import torch
from _registry import Options
from _rows import row

from marquardt.testing import nist as nist_strd

#: LRE below this is a failed fit.
FAIL_BELOW = 4.0


def _numpy_model(problem: nist_strd.NistProblem) -> Any:
    """f(x, *b) with NumPy arrays, through the torch model (float64, no autograd)."""

    def f(x: np.ndarray, *b: float) -> np.ndarray:
        with torch.no_grad():
            out = problem.f(torch.from_numpy(np.asarray(x)), *torch.tensor(b, dtype=torch.float64))
        return out.numpy()

    return f


def ours(problem: nist_strd.NistProblem, start: int, lma: dict[str, Any]) -> dict[str, Any]:
    """One fit with curve_fit's defaults (``lma`` overrides its LMA options)."""
    from marquardt.solver import curve_fit_result

    p0 = torch.tensor(problem.starts[start - 1], dtype=torch.float64)
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = curve_fit_result(problem.f, problem.x, problem.y, p0, lma_options=lma)
        popt, steps = result.popt, result.steps
        error = ""
    except Exception as exc:  # a failed fit is a result here, not a crash
        popt, steps, error = torch.full_like(p0, math.nan), 0, repr(exc)[:200]
    seconds = time.perf_counter() - t
    return {
        "lre": nist_strd.lre(popt, problem.certified),
        "steps": steps,
        "seconds": seconds,
        "error": error,
        "popt": popt.tolist(),
    }


def scipy_lm(problem: nist_strd.NistProblem, start: int) -> dict[str, Any]:
    """One fit with ``scipy.optimize.curve_fit(method="lm")``'s defaults."""
    from scipy.optimize import curve_fit

    p0 = np.array(problem.starts[start - 1])
    t = time.perf_counter()
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            popt, _, info, _, _ = curve_fit(
                _numpy_model(problem),
                problem.x.numpy(),
                problem.y.numpy(),
                p0,
                method="lm",
                full_output=True,
            )
        evaluations, error = int(info["nfev"]), ""
    except Exception as exc:  # SciPy raises when lm does not converge
        popt, evaluations, error = np.full_like(p0, math.nan), 0, repr(exc)[:200]
    seconds = time.perf_counter() - t
    return {
        "lre": nist_strd.lre(popt, problem.certified),
        "evaluations": evaluations,
        "seconds": seconds,
        "error": error,
    }


def fits(quick: bool = False, lma: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every fit; the totals."""
    lma = dict(lma or {})
    problems = nist_strd.nist_problems()
    if quick:
        problems = tuple(p for p in problems if p.difficulty == "higher")
    starts = (1,) if quick else (1, 2)
    ours(problems[0], 2, lma)  # warm-up: torch's functorch starts on the first call
    load_before = _machine.load_average()
    fits = []
    for problem in problems:
        for start in starts:
            fits.append(
                {
                    "problem": problem.name,
                    "difficulty": problem.difficulty,
                    "start": start,
                    "ours": ours(problem, start, lma),
                    "scipy_lm": scipy_lm(problem, start),
                }
            )
    return {
        "config": "marquardt.solver.curve_fit(f, x, y, p0) defaults"
        + (f", LMA options {lma}" if lma else "")
        + " vs scipy.optimize.curve_fit(method='lm') defaults; float64, CPU, "
        f"{torch.get_num_threads()} torch thread(s)",
        "lma": {k: repr(v) for k, v in lma.items()},
        "quick": quick,
        "fail_below": FAIL_BELOW,
        "load_before": load_before,
        "load_after": _machine.load_average(),
        "fits": fits,
        "totals": totals(fits),
    }


def totals(fits: list[dict[str, Any]]) -> dict[str, Any]:
    """Fails on each side, our total steps, the seconds of each side."""
    return {
        "fits": len(fits),
        "ours_fails": sum(f["ours"]["lre"] < FAIL_BELOW for f in fits),
        "scipy_fails": sum(f["scipy_lm"]["lre"] < FAIL_BELOW for f in fits),
        "ours_failed": [
            f"{f['problem']} {f['start']}" for f in fits if f["ours"]["lre"] < FAIL_BELOW
        ],
        "scipy_failed": [
            f"{f['problem']} {f['start']}" for f in fits if f["scipy_lm"]["lre"] < FAIL_BELOW
        ],
        "ours_steps": sum(f["ours"]["steps"] for f in fits),
        "scipy_evaluations": sum(f["scipy_lm"]["evaluations"] for f in fits),
        "ours_seconds": sum(f["ours"]["seconds"] for f in fits),
        "scipy_seconds": sum(f["scipy_lm"]["seconds"] for f in fits),
    }


def main(quick: bool = False, lma: dict[str, Any] | None = None) -> dict[str, Any]:
    torch.set_num_threads(1)
    results = fits(quick=quick, lma=lma)
    results["machine"] = _machine.describe()["cpu"]
    return results


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The aggregate rows: fails of each side (target: no more than SciPy's)."""
    t = results["totals"]
    return [
        row(
            f"nist: fits with LRE < {FAIL_BELOW:g}, ours (of {t['fits']})",
            float(t["ours_fails"]),
            float(t["scipy_fails"]),
            unit="",
            detail=f"SciPy lm {t['scipy_fails']}; ours {', '.join(t['ours_failed']) or 'none'}; "
            f"{t['ours_steps']} steps in all, {t['ours_seconds']:.1f} s "
            f"(SciPy {t['scipy_evaluations']} evaluations, {t['scipy_seconds']:.1f} s)",
        )
    ]


def section(results: dict[str, Any]) -> str:
    """The RESULTS.md section: one line per fit."""
    t = results["totals"]
    out = [
        f"{results['config']}; load {results['load_before']:.1f} → {results['load_after']:.1f}. "
        f"LRE: correct significant digits against NIST's certified parameters (capped at 11); "
        f"a fit fails below {FAIL_BELOW:g}.",
        "",
        "| problem | difficulty | start | LRE ours | LRE SciPy lm | ours steps | SciPy nfev | "
        "ours s | SciPy s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in results["fits"]:
        o, s = f["ours"], f["scipy_lm"]
        out.append(
            f"| {f['problem']} | {f['difficulty']} | {f['start']} | {o['lre']:.1f} | "
            f"{s['lre']:.1f} | {o['steps']} | {s['evaluations']} | {o['seconds']:.3f} | "
            f"{s['seconds']:.3f} |"
        )
    out += [
        "",
        f"Fails (LRE < {FAIL_BELOW:g}): ours {t['ours_fails']} of {t['fits']} "
        f"({', '.join(t['ours_failed']) or 'none'}), SciPy lm {t['scipy_fails']} "
        f"({', '.join(t['scipy_failed']) or 'none'}). Ours: {t['ours_steps']} LM steps in all, "
        f"{t['ours_seconds']:.1f} s; SciPy: {t['scipy_evaluations']} evaluations, "
        f"{t['scipy_seconds']:.1f} s.",
    ]
    return "\n".join(out)


def _option(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick)
