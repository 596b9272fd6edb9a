"""2-D Gaussian spots: ``curve_fit_batch`` against Cpufit and a SciPy loop, in one run.

The spots are Gpufit's GAUSS_2D model, a·exp(−((x − x₀)² + (y − y₀)²)/(2w²)) + b on
S × S pixels (x the fast index, as Cpufit lays them out), S = 5 and 7: amplitude 500,
centre (S − 1)/2 ± 0.5, width 1 ± 10 %, offset 10, Poisson noise; starts: amplitude,
width and offset × U(0.8, 1.2), centre ± U(−0.3, 0.3). The same spots go to every side,
in float32 and float64, M = 10⁴ and 10⁵, and M = 10⁶ in float32 (``LARGE_ROWS``; quick:
5 × 5, M = 10⁴); the float64 rows at M = 10⁶ with ``main(sizes=(1000000,))`` (a row of
five sides takes minutes at that size on two cores). Each row runs in two processes, one
after the other, sharing the user's cache folder (``case``): the first makes each of our
sides' first call (``first_calls``: the compiles a first run of a script pays, inline or
in the background, whose builds it waits for), the second
measures every side (``measure``), as a scientist's second run; the first process's first
calls and compile times are shown beside the second's figures.

Sides:

* ours, ``marquardt.solver.curve_fit_batch``, with its default arguments (threads and
  ``compile="auto"`` included) and with Cpufit's stopping (``ftol=1e-4``, ``max_nfev=11``:
  ten iterations after the start's evaluation), on the default thread count, one thread
  and two; each side's first call (with its compile, ``compile_seconds``) and the faster
  of two more, steady calls;
* Cpufit, a library the user built from Gpufit's sources as Gpufit's documentation says
  (its float library's path as ``CPUFIT_LIB``, or ``main``'s ``cpufit``), least squares
  (LSE), tolerance 1e-4, at most 10
  iterations: one thread, as Cpufit has no threading; timed as ours is (its inputs cast
  to its dtype outside the clock, a first call, then the faster of ``STEADY_CALLS`` more);
* ``scipy.optimize.curve_fit`` (defaults, NumPy model) in a loop over ``SCIPY_FITS`` fits,
  fits/s extrapolated.

Ratios, from the steady calls: ours (default arguments) / SciPy (target ≥ 50 in float64;
a float32 row against SciPy's float64 loop is shown without a target: not like for like); ours
(Cpufit's stopping, one thread) / Cpufit (≥ 1) and with the default threads / Cpufit
(≥ 1.8 on two cores; threads=2 beside it); default
threads / one thread (never below 1). Recorded with each size: the 1-minute load average
before and after, and the CPU model. Without a Cpufit build the Cpufit columns are
empty and the run says so.

``CPUFIT_LIB=PATH python benchmarks/run_all.py cpufit [--quick]``; ``main()`` returns the summary; one size alone:
``python benchmarks/_child.py bench_cpufit main '[false, "PATH", [1000000]]'``.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import _machine
import numpy as np
import torch
from _registry import Options
from _rows import row

from marquardt.testing.problems import gauss2d, gauss2d_numpy, spots

SPOTS = (5, 7)
QUICK_SPOTS = (5,)
SIZES = (10_000, 100_000)
#: The rows at M = 10⁶ a full run adds (spot side, dtype): a row of five sides takes minutes
#: there on two cores, so the float64 ones are left to ``main(sizes=(1000000,))``.
LARGE_ROWS = ((5, "float32"), (7, "float32"))
LARGE = 1_000_000
QUICK_SIZES = (10_000,)
DTYPES = ("float32", "float64")
SCIPY_FITS = 300
QUICK_SCIPY_FITS = 100
#: Cpufit's stopping: |Δχ²| < max(tol, tol·χ²), at most 10 iterations.
CPUFIT_TOLERANCE = 1e-4
CPUFIT_ITERATIONS = 10
SCIPY_TARGET = 50.0
CPUFIT_ONE_TARGET = 1.0
CPUFIT_TWO_TARGET = 1.8
ENV = "CPUFIT_LIB"
#: Calls after the first, the fastest of which is the steady figure (the first of them can
#: still pay for fresh pages of its sizes).
STEADY_CALLS = 2
HEAD = (
    "spot | dtype | M | ours default fits/s (first call s, compile s: first process; "
    "first call s: second) | one thread | "
    "Cpufit stop: default / 1 thr / 2 thr | Cpufit 1 thr | SciPy loop | ×SciPy | "
    "1 thr/Cpufit | 2 thr/Cpufit | default/1 thr | load"
)


def _ours(problem: dict[str, np.ndarray], dtype: str, **options: Any) -> dict[str, Any]:
    """A first call and a steady one of ``curve_fit_batch`` with ``options``."""
    from marquardt.solver import curve_fit_batch

    kind = getattr(torch, dtype)
    x, y, p0 = (torch.from_numpy(problem[k]).to(kind) for k in ("x", "y", "p0"))
    fits = y.shape[0]
    timings = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(1 + STEADY_CALLS):
            start = time.perf_counter()
            popt, _, info = curve_fit_batch(gauss2d, x, y, p0, full_output=True, **options)
            timings.append((time.perf_counter() - start, info))
    first, info_first = timings[0]
    steady = min(seconds for seconds, _ in timings[1:])
    return {
        "first_s": first,
        "compile_s": info_first["compile_seconds"],
        "compiled": bool(info["compiled"]),
        "fits_per_s": fits / steady,
        "mean_steps": float(info["steps"].double().mean()),
        "converged": float((info["status"] > 0).double().mean()),
        "popt": popt.double().numpy(),
    }


def _cpufit(library: Any, problem: dict[str, np.ndarray]) -> dict[str, Any]:
    """Cpufit timed as ours is: its inputs cast to its dtype before the clock starts (ours
    are cast outside its clock too), a first call, then the faster of ``STEADY_CALLS``."""
    data = np.ascontiguousarray(problem["y"], dtype=library.dtype)
    start_p = np.ascontiguousarray(problem["p0"], dtype=library.dtype)
    timings = []
    for _ in range(1 + STEADY_CALLS):
        start = time.perf_counter()
        out = library.fit(
            data, start_p, tolerance=CPUFIT_TOLERANCE, max_iterations=CPUFIT_ITERATIONS
        )
        timings.append(time.perf_counter() - start)
    return {
        "first_s": timings[0],
        "fits_per_s": data.shape[0] / min(timings[1:]),
        "mean_iterations": float(out.iterations.mean()),
        "converged": float((out.states == 0).mean()),
        "popt": out.parameters.astype(np.float64),
    }


def _scipy(problem: dict[str, np.ndarray], count: int) -> dict[str, Any]:
    from scipy.optimize import curve_fit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        for m in range(count):
            curve_fit(gauss2d_numpy, problem["x"], problem["y"][m], problem["p0"][m])
    return {"fits_timed": count, "fits_per_s": count / (time.perf_counter() - start)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def _median_gap(a: np.ndarray, b: np.ndarray, true: np.ndarray) -> float:
    """Median over the fits of max |a − b| / |true| over the parameters."""
    return float(np.median(np.max(np.abs(a - b) / np.abs(true), axis=1)))


#: Our sides by name: ``curve_fit_batch``'s options beyond the data.
OURS: dict[str, dict[str, Any]] = {
    "ours_default": {},
    "ours_default_one_thread": {"threads": 1},
    "ours_cpufit_stopping": {"ftol": CPUFIT_TOLERANCE, "max_nfev": CPUFIT_ITERATIONS + 1},
    "ours_cpufit_stopping_one_thread": {
        "ftol": CPUFIT_TOLERANCE,
        "max_nfev": CPUFIT_ITERATIONS + 1,
        "threads": 1,
    },
    "ours_cpufit_stopping_two_threads": {
        "ftol": CPUFIT_TOLERANCE,
        "max_nfev": CPUFIT_ITERATIONS + 1,
        "threads": 2,
    },
}
#: The most seconds one row's process may take.
CHILD_TIMEOUT = 1800.0


def first_calls(size: int, fits: int, dtype: str) -> dict[str, dict[str, float]]:
    """The first process of a row (run by ``_child``): each of our sides' first call, with
    the compile it paid, as a scientist's first run of the script."""
    from marquardt.solver import curve_fit_batch

    problem = spots(size, fits)
    kind = getattr(torch, dtype)
    x, y, p0 = (torch.from_numpy(problem[k]).to(kind) for k in ("x", "y", "p0"))
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, options in OURS.items():
            start = time.perf_counter()
            *_, info = curve_fit_batch(gauss2d, x, y, p0, full_output=True, **options)
            out[name] = {
                "first_s": time.perf_counter() - start,
                "compile_s": info["compile_seconds"],
            }
    # Default calls build missing kernels in the background: the first run of a script
    # leaves them for the second, so this process waits for its builds.
    from marquardt.solver._curve.kernel_cache import background

    start = time.perf_counter()
    background.wait()
    out["background_builds"] = {"build_s": time.perf_counter() - start}
    return out


def case(size: int, fits: int, dtype: str, cpufit: str | None, scipy_fits: int) -> dict[str, Any]:
    """One row in two processes, one after the other, sharing the user's cache folder:
    ``first_calls`` in the first, ``measure`` in the second (whose figures the row shows)."""
    import _child

    first, error = _child.call(
        "bench_cpufit", "first_calls", [size, fits, dtype], timeout=CHILD_TIMEOUT
    )
    if error:
        raise RuntimeError(f"cpufit {size}x{size} {dtype} M={fits}, first process: {error}")
    out, error = _child.call(
        "bench_cpufit", "measure", [size, fits, dtype, cpufit, scipy_fits], timeout=CHILD_TIMEOUT
    )
    if error:
        raise RuntimeError(f"cpufit {size}x{size} {dtype} M={fits}, second process: {error}")
    out["first_process"] = first
    return dict(out)


def measure(
    size: int, fits: int, dtype: str, cpufit: str | None, scipy_fits: int
) -> dict[str, Any]:
    """One row: every side on the same spots (module docstring), in this process."""
    from cpufit.library import load

    libraries = load(cpufit) if cpufit else {}
    load_before = _machine.load_average()
    problem = spots(size, fits)
    default, default_one, stopped, one, two = (
        _ours(problem, dtype, **options) for options in OURS.values()
    )
    library = libraries.get(dtype)
    peer = None if library is None else _cpufit(library, problem)
    scipy = _scipy(problem, min(fits, scipy_fits))
    row: dict[str, Any] = {
        "spot": f"{size}x{size}",
        "fits": fits,
        "dtype": dtype,
        "load_before": load_before,
        "load_after": _machine.load_average(),
        "ours_default": default,
        "ours_default_one_thread": default_one,
        "ours_cpufit_stopping": stopped,
        "ours_cpufit_stopping_one_thread": one,
        "ours_cpufit_stopping_two_threads": two,
        "cpufit": peer,
        "scipy_loop": scipy,
        "vs_scipy": _ratio(default["fits_per_s"], scipy["fits_per_s"]),
        "one_thread_vs_cpufit": _ratio(one["fits_per_s"], peer and peer["fits_per_s"]),
        "two_threads_vs_cpufit": _ratio(two["fits_per_s"], peer and peer["fits_per_s"]),
        "default_threads_vs_cpufit": _ratio(stopped["fits_per_s"], peer and peer["fits_per_s"]),
        "default_vs_one_thread": _ratio(default["fits_per_s"], default_one["fits_per_s"]),
        "stopping_default_vs_one_thread": _ratio(stopped["fits_per_s"], one["fits_per_s"]),
    }
    if peer is not None:
        row["popt_gap_vs_cpufit"] = _median_gap(one["popt"], peer["popt"], problem["true"])
    for side in (default, default_one, stopped, one, two, peer):
        if side is not None:
            side.pop("popt", None)
    return row


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def echo(summary: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    print(f"# cpu: {summary['machine']['cpu']}, cores: {summary['machine']['cores']}")
    print(f"# Cpufit: {summary['cpufit'] or 'none given: ' + summary['cpufit_note']}")
    print(HEAD)
    for r in summary["rows"]:
        print(_line(r))


def _line(r: dict[str, Any]) -> str:
    d, s = r["ours_default"], r["ours_cpufit_stopping"]
    peer = r["cpufit"]
    return (
        f"{r['spot']} | {r['dtype']} | {r['fits']:,} | {_rate(d['fits_per_s'])} "
        f"({_first_compact(r)}) | "
        f"{_rate(r['ours_default_one_thread']['fits_per_s'])} | "
        f"{_rate(s['fits_per_s'])} / "
        f"{_rate(r['ours_cpufit_stopping_one_thread']['fits_per_s'])} / "
        f"{_rate(r['ours_cpufit_stopping_two_threads']['fits_per_s'])} | "
        f"{_rate(peer and peer['fits_per_s'])} | {_rate(r['scipy_loop']['fits_per_s'])} | "
        f"{_times(r['vs_scipy'])} | {_times(r['one_thread_vs_cpufit'])} | "
        f"{_times(r['two_threads_vs_cpufit'])} | {_times(r['default_vs_one_thread'])} | "
        f"{r['load_before']:.1f}→{r['load_after']:.1f}"
    )


def main(
    quick: bool = False, cpufit: str | None = None, sizes: tuple[int, ...] | None = None
) -> dict[str, Any]:
    """Every row (module docstring), or those of ``sizes`` M; prints them and returns the
    summary."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cpufit.library import load

    path = cpufit or os.environ.get(ENV)
    note = ""
    if path:
        load(path)  # refused here, before any work, when it is not a library
    else:
        note = (
            f"no Cpufit library given ({ENV}=PATH): the Cpufit columns are "
            "empty. Build Cpufit as Gpufit's documentation says (gpufit.readthedocs.io, "
            "'Installation and Testing') and pass the path of its float library (a double "
            "build beside it, named as library.py says, adds the float64 rows)"
        )
        print(f"# {note}")
    print(HEAD, flush=True)
    rows = []
    for size in QUICK_SPOTS if quick else SPOTS:
        for dtype in DTYPES:
            for fits in sizes or (QUICK_SIZES if quick else SIZES):
                rows.append(
                    case(size, fits, dtype, path, QUICK_SCIPY_FITS if quick else SCIPY_FITS)
                )
                print(_line(rows[-1]), flush=True)
    for size, dtype in () if quick or sizes else LARGE_ROWS:
        rows.append(case(size, LARGE, dtype, path, SCIPY_FITS))
        print(_line(rows[-1]), flush=True)
    summary = {
        "benchmark": "cpufit",
        "quick": quick,
        "sizes": list(sizes or (QUICK_SIZES if quick else SIZES)),
        "machine": _machine.describe(),
        "cpufit": str(path) if path else None,
        "cpufit_note": note,
        "targets": {
            "vs_scipy": SCIPY_TARGET,
            "one_thread_vs_cpufit": CPUFIT_ONE_TARGET,
            "two_threads_vs_cpufit": CPUFIT_TWO_TARGET,
            "default_vs_one_thread": 1.0,
        },
        "rows": rows,
    }
    echo(summary)
    return summary


def rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured size's ratios against their targets (module docstring)."""
    out = []
    for r in summary["rows"]:
        label = f"cpufit {r['spot']} {r['dtype']} M={r['fits']:,}"
        d, one = r["ours_default"], r["ours_cpufit_stopping_one_thread"]
        load = f"load {r['load_before']:.1f} → {r['load_after']:.1f}"
        first = _firsts(r, "ours_default")
        # SciPy's loop runs in float64 at its own tolerances: a float32 row against it
        # compares unlike things (our float32 stops near 1e-6, SciPy's at 1.49e-8), so it
        # is shown without a target, as ``bench_batch_fit`` shows it.
        like = r["dtype"] == "float64"
        versus = "SciPy loop (float64)" if like else "SciPy loop (float64; not like for like)"
        out.append(
            row(
                f"{label}: ours default / {versus}",
                r["vs_scipy"],
                SCIPY_TARGET if like else None,
                op="≥",
                detail=f"ours {_rate(d['fits_per_s'])} fits/s ({first}), SciPy "
                f"{_rate(r['scipy_loop']['fits_per_s'])}; {load}",
            )
        )
        peer = r["cpufit"]
        out.append(
            row(
                f"{label}: ours 1 thread / Cpufit (its stopping)",
                r["one_thread_vs_cpufit"],
                CPUFIT_ONE_TARGET,
                op="≥",
                detail=f"ours {_rate(one['fits_per_s'])} fits/s "
                f"({_firsts(r, 'ours_cpufit_stopping_one_thread')}), Cpufit "
                f"{_rate(peer and peer['fits_per_s'])}; {load}",
            )
        )
        two, stopped = r["ours_cpufit_stopping_two_threads"], r["ours_cpufit_stopping"]
        out.append(
            row(
                f"{label}: ours default threads / Cpufit (its stopping)",
                r.get("default_threads_vs_cpufit"),
                CPUFIT_TWO_TARGET,
                op="≥",
                detail=f"ours {_rate(stopped['fits_per_s'])} fits/s with the default threads, "
                f"{_rate(two['fits_per_s'])} with threads=2 "
                f"({_times(r['two_threads_vs_cpufit'])} Cpufit); {load}",
            )
        )
        out.append(
            row(
                f"{label}: default threads / one thread (fits/s)",
                r["default_vs_one_thread"],
                1.0,
                op="≥",
                detail=f"{_rate(d['fits_per_s'])} against "
                f"{_rate(r['ours_default_one_thread']['fits_per_s'])} fits/s; {load}",
            )
        )
    return out


def _first_compact(r: dict[str, Any]) -> str:
    """The default side's first calls for the table: "first, compile; second" (seconds)."""
    d = r["ours_default"]
    first = r.get("first_process", {}).get("ours_default")
    if first is None:  # a record of one process
        return f"{d['first_s']:.1f}, {d['compile_s']:.1f}"
    return f"{first['first_s']:.1f}, {first['compile_s']:.1f}; {d['first_s']:.1f}"


def _firsts(r: dict[str, Any], side: str) -> str:
    """A side's first calls: the first process's (with its compile) and the second's."""
    first = r.get("first_process", {}).get(side)
    second = r[side]
    if first is None:  # a record of one process
        return f"first call {second['first_s']:.1f} s (compile {second['compile_s']:.1f} s)"
    return (
        f"first process: first call {first['first_s']:.1f} s, compile "
        f"{first['compile_s']:.1f} s; second: first call {second['first_s']:.1f} s"
    )


def section(summary: dict[str, Any]) -> str:
    """The rows as a Markdown table, with the machine and the Cpufit build."""
    machine = summary["machine"]
    given = summary["cpufit"] or "none given: " + summary["cpufit_note"]
    head = HEAD.split(" | ")
    lines = [
        f"CPU {machine['cpu']}, {machine['cores']} cores; Cpufit: {given}. Fits/s from the "
        "faster of two steady calls after the first; SciPy's loop extrapolated from "
        f"{SCIPY_FITS} fits.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + _line(r) + " |" for r in summary["rows"]]
    return "\n".join(lines)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick)
