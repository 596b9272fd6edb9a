"""Many small fits at once: ``curve_fit_batch`` against a SciPy loop, torchimize, our loop.

Problems (Poisson-like noise, starts perturbed from the truth, the same on every side):

* Gpufit's 2-D Gaussian: amplitude, x₀, y₀, width, offset on 5 × 5 pixels; amplitude
  500, centre 2 ± 0.5, width 1 ± 10 %, offset 10; starts: amplitude and width × U(0.8, 1.2),
  centre ± U(−0.3, 0.3), offset × U(0.8, 1.2); M = 10³, 10⁴, 10⁵ (10⁶ when 10⁵ took under
  ``BIG_SECONDS``; on a GPU 10⁷ when 10⁶ did), float64 and float32;
* the same spots on 7 × 7 pixels, M = 4,000 (``SPOTS_7``), float64, against its own SciPy loop;
* an exponential decay a·exp(−k·t) + c (3 parameters, 64 time points) per pixel of a
  512 × 512 image, float64.

Sides: ours, ``marquardt.solver.curve_fit_batch`` on the whole batch with its default
arguments (its thread rule, at most the suite's two threads, and ``compile="auto"``: the
warm-up call starts the background builds of missing kernels, and the timed calls come
after they end, as in a later run of the script), and
again with ``threads`` at the suite's two; the peers on one thread; SciPy,
``scipy.optimize.curve_fit`` (defaults, NumPy model) in a loop over ``LOOP_FITS`` fits,
fits/s extrapolated; torchimize's ``lsq_lma_parallel`` (its autodiff Jacobian, its
defaults) on the first ``PEER_MAX`` fits of the same batch (its fits/s at 10⁴ fits: it
needs minutes for 10⁵); our own single ``curve_fit`` (torch
model) in a loop over ``OUR_LOOP_FITS`` fits. Accuracy: the fraction of parameter
estimates within two standard errors (√diag pcov) of the truth, and the largest relative
difference between our batch and SciPy's popt on the fits SciPy ran.

Targets on the CPU: ≥ 50× the SciPy loop's fits/s at M ≥ 10⁴ in float64 (the float32 rows
against SciPy's float64 loop at its tolerances are shown, without a target: not like for
like) and ≥ 2× torchimize's (its rows name the M it ran);
on a GPU (``--device cuda``): ≥ 10⁷ 2-D Gaussian fits/s.
``python benchmarks/run_all.py batch_fit [--quick] [--device cuda]``.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import _common as c
import _machine
import numpy as np
import torch
from _registry import Options
from _rows import row

from marquardt.testing.problems import decay, decay_numpy, gauss2d, gauss2d_numpy, spots

SIZES = (1_000, 10_000, 100_000, 1_000_000)
#: On a GPU also 10⁷ fits (Gpufit's profiling size) when 10⁶ took under ``BIG_SECONDS``.
GPU_SIZES = (*SIZES, 10_000_000)
QUICK_SIZES = (1_000, 10_000)
BIG_SECONDS = 6.0
LOOP_FITS = 1_000
OUR_LOOP_FITS = 200
PEER_MAX = 10_000
IMAGE = 512
#: The 7 × 7 spots' batch (module docstring).
SPOTS_7 = 4_000
QUICK_IMAGE = 64
SCIPY_TARGET = 50.0
PEER_TARGET = 2.0
GPU_TARGET = 1e7
PEER_PATHS = ("/work/peers/torchimize_t",)


def gaussian_problem(fits: int, seed: int = 0, size: int = 5) -> dict[str, Any]:
    """``fits`` ``size`` × ``size`` Gaussian spots (``marquardt.testing.problems.spots``)."""
    return {**spots(size, fits, seed), "f": gauss2d, "f_numpy": gauss2d_numpy}


def _loop_key(problem: str) -> str:
    """The SciPy and our loops a case is compared with: its problem's (one per image size
    for the decay)."""
    return "decay" if problem.startswith("decay") else problem


def decay_problem(fits: int, seed: int = 1) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 10.0, 64)
    true = np.c_[rng.uniform(200, 400, fits), rng.uniform(0.3, 1.0, fits), rng.uniform(5, 15, fits)]
    y = rng.poisson(decay_numpy(t, *(true.T[..., None]))).astype(np.float64)
    p0 = true * rng.uniform(0.7, 1.3, (fits, 3))
    return {"x": t, "y": y, "p0": p0, "true": true, "f": decay, "f_numpy": decay_numpy}


def _coverage(popt: np.ndarray, pcov: np.ndarray, true: np.ndarray) -> float:
    """The fraction of estimates with |p − p_true| < 2·se, se = √diag(pcov)."""
    se = np.sqrt(np.abs(np.diagonal(pcov, axis1=1, axis2=2)))
    return float(np.mean(np.abs(popt - true) < 2.0 * se))


def _ours(
    problem: dict[str, Any], fits: int, dtype: torch.dtype, device: torch.device
) -> dict[str, Any]:
    from marquardt.solver import curve_fit_batch

    x = torch.from_numpy(problem["x"]).to(device, dtype)
    y = torch.from_numpy(problem["y"][:fits]).to(device, dtype)
    p0 = torch.from_numpy(problem["p0"][:fits]).to(device, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Warm-up on a chunk's worth of fits: the allocator learns the sizes (glibc serves
        # large blocks by mmap, with fresh pages, until one of that size has been freed).
        warm = min(fits, 16_384)
        curve_fit_batch(problem["f"], x, y[:warm], p0[:warm])
        c.synchronize(device)
        _builds_done()
        start = time.perf_counter()
        popt, pcov, info = curve_fit_batch(problem["f"], x, y, p0, full_output=True)
        c.synchronize(device)
        seconds = time.perf_counter() - start
        more = None
        if device.type == "cpu":  # the same fits on the suite's thread count
            start = time.perf_counter()
            curve_fit_batch(problem["f"], x, y, p0, threads=c.THREADS)
            more = fits / (time.perf_counter() - start)
    p, cov = popt.double().cpu().numpy(), pcov.double().cpu().numpy()
    status = info["status"].cpu().numpy()
    return {
        "seconds": seconds,
        "fits_per_s": fits / seconds,
        "fits_per_s_more_threads": more,
        "threads": c.THREADS,
        "coverage_2se": _coverage(p, cov, problem["true"][:fits]),
        "converged": float(np.mean(status > 0)),
        "mean_nfev": float(info["nfev"].double().mean()),
        "popt_head": p[:LOOP_FITS],
    }


def _builds_done() -> None:
    """Wait for the kernels a default call builds in the background (none where they are
    kept): the timed calls then run as a later run of the script would, and no build
    competes with them for the cores."""
    from marquardt.solver._curve.kernel_cache import background

    background.wait()


def _scipy_loop(problem: dict[str, Any], fits: int) -> dict[str, Any]:
    from scipy.optimize import curve_fit

    count = min(fits, LOOP_FITS)
    popt, pcov = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        for m in range(count):
            p, cov = curve_fit(problem["f_numpy"], problem["x"], problem["y"][m], problem["p0"][m])
            popt.append(p)
            pcov.append(cov)
    seconds = time.perf_counter() - start
    p = np.array(popt)
    return {
        "fits_timed": count,
        "fits_per_s": count / seconds,
        "coverage_2se": _coverage(p, np.array(pcov), problem["true"][:count]),
        "popt": p,
    }


def _our_loop(problem: dict[str, Any], fits: int) -> dict[str, Any]:
    from marquardt.solver import curve_fit

    count = min(fits, OUR_LOOP_FITS)
    x = torch.from_numpy(problem["x"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        for m in range(count):
            curve_fit(problem["f"], x, torch.from_numpy(problem["y"][m]), list(problem["p0"][m]))
    return {"fits_timed": count, "fits_per_s": count / (time.perf_counter() - start)}


def _torchimize() -> Callable[..., Any] | None:
    for path in PEER_PATHS:
        if path not in sys.path:
            sys.path.append(path)
    try:
        from torchimize.functions import lsq_lma_parallel
    except ImportError:
        return None
    return lsq_lma_parallel  # type: ignore[no-any-return]


def _peer(
    problem: dict[str, Any], fits: int, dtype: torch.dtype, device: torch.device
) -> dict[str, Any] | None:
    lsq = _torchimize()
    if lsq is None:
        return None
    fits = min(fits, PEER_MAX)
    x = torch.from_numpy(problem["x"]).to(device, dtype)
    y = torch.from_numpy(problem["y"][:fits]).to(device, dtype)
    f = problem["f"]

    def residuals(p: torch.Tensor) -> torch.Tensor:  # (M, 1, N), the peer's layout
        return (torch.vmap(lambda q: f(x, *q.unbind()))(p) - y[: p.shape[0]])[:, None, :]

    p0 = torch.from_numpy(problem["p0"][:fits]).to(device, dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the threads ours runs on by default
    try:
        lsq(p0[:64].clone(), residuals, max_iter=2)  # warm-up
        start = time.perf_counter()
        out = lsq(p0.clone(), residuals)
        c.synchronize(device)
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    p = out[-1].double().cpu().numpy()
    return {
        "fits_timed": fits,
        "seconds": seconds,
        "fits_per_s": fits / seconds,
        "iterations": len(out),
        "popt_head": p[:LOOP_FITS],
    }


def measure(
    name: str,
    problem: dict[str, Any],
    fits: int,
    dtype: torch.dtype,
    device: torch.device,
    loops: bool,
) -> dict[str, Any]:
    load_before = _machine.load_average()
    ours = _ours(problem, fits, dtype, device)
    entry: dict[str, Any] = {"problem": name, "fits": fits, "dtype": str(dtype), "ours": ours}
    peer = _peer(problem, fits, dtype, device)
    if peer is not None:
        entry["torchimize"] = {k: v for k, v in peer.items() if k != "popt_head"}
        head = min(len(peer["popt_head"]), len(ours["popt_head"]))
        diff = np.abs(peer["popt_head"][:head] - ours["popt_head"][:head]) / np.abs(
            ours["popt_head"][:head]
        )
        entry["torchimize"]["median_relative_popt_difference"] = float(np.median(diff))
        entry["ratio_vs_torchimize"] = ours["fits_per_s"] / peer["fits_per_s"]
    if loops:
        scipy = _scipy_loop(problem, fits)
        head = scipy["popt"].shape[0]
        rel = np.abs(ours["popt_head"][:head] - scipy["popt"]) / np.abs(scipy["popt"])
        entry["scipy_loop"] = {k: v for k, v in scipy.items() if k != "popt"}
        entry["scipy_loop"]["max_relative_popt_difference"] = float(np.max(rel))
        entry["scipy_loop"]["median_relative_popt_difference"] = float(np.median(rel))
        entry["our_loop"] = _our_loop(problem, fits)
    ours.pop("popt_head")
    entry["load_before"], entry["load_after"] = load_before, _machine.load_average()
    print(
        f"  {name} M={fits:,} {dtype}: ours {ours['fits_per_s']:,.0f} fits/s "
        f"({ours['seconds']:.2f} s, coverage {ours['coverage_2se']:.3f}); "
        + (f"torchimize {peer['fits_per_s']:,.0f}/s; " if peer else "")
        + (f"SciPy loop {entry['scipy_loop']['fits_per_s']:,.0f}/s" if loops else "")
        + f"; load {load_before:.1f}",
        flush=True,
    )
    return entry


def main(quick: bool = False, device: str = "cpu") -> dict[str, Any]:
    c.setup_threads()
    where = torch.device(device)
    results: dict[str, Any] = {
        "device": str(where),
        "quick": quick,
        "machine": {k: v for k, v in _machine.describe().items() if k in ("cpu", "cores", "torch")},
        "cases": [],
    }
    sizes = QUICK_SIZES if quick else SIZES if where.type == "cpu" else GPU_SIZES
    problem = gaussian_problem(max(sizes))
    loops: dict[str, dict[str, Any]] = {}
    for dtype in (torch.float64, torch.float32):
        for fits in sizes:
            if fits >= 1_000_000 and not _fast_enough(results["cases"], dtype, fits // 10):
                continue
            first = fits == sizes[0] and dtype == torch.float64
            entry = measure("gauss2d", problem, fits, dtype, where, loops=first)
            if "scipy_loop" in entry:
                loops["gauss2d"] = {
                    "scipy_loop": entry["scipy_loop"],
                    "our_loop": entry["our_loop"],
                }
            results["cases"].append(entry)
    if not quick:
        seven = measure(
            "gauss2d 7x7",
            gaussian_problem(SPOTS_7, size=7),
            SPOTS_7,
            torch.float64,
            where,
            loops=True,
        )
        loops["gauss2d 7x7"] = {"scipy_loop": seven["scipy_loop"], "our_loop": seven["our_loop"]}
        results["cases"].append(seven)
    side = QUICK_IMAGE if quick else IMAGE
    image = decay_problem(side * side)
    entry = measure(f"decay {side}x{side}", image, side * side, torch.float64, where, loops=True)
    loops["decay"] = {"scipy_loop": entry["scipy_loop"], "our_loop": entry["our_loop"]}
    results["cases"].append(entry)
    for e in results["cases"]:
        ref = loops[_loop_key(e["problem"])]
        e["ratio_vs_scipy_loop"] = e["ours"]["fits_per_s"] / ref["scipy_loop"]["fits_per_s"]
        e["ratio_vs_our_loop"] = e["ours"]["fits_per_s"] / ref["our_loop"]["fits_per_s"]
    results["loops"] = loops
    return results


def _fast_enough(cases: list[dict[str, Any]], dtype: torch.dtype, fits: int) -> bool:
    done = [e for e in cases if e["dtype"] == str(dtype) and e["fits"] == fits]
    return bool(done) and done[0]["ours"]["seconds"] < BIG_SECONDS


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    gpu = results["device"] != "cpu"
    for e in results["cases"]:
        label = f"batch fit {e['problem']} M={e['fits']:,} {e['dtype'].replace('torch.', '')}"
        ours = e["ours"]
        load = f"load {e['load_before']:.1f} → {e['load_after']:.1f}"
        if gpu:
            if e["problem"] == "gauss2d":
                rows.append(
                    row(
                        f"{label}: fits/s",
                        ours["fits_per_s"],
                        GPU_TARGET,
                        op="≥",
                        unit="",
                        detail=load,
                    )
                )
            continue
        big = e["fits"] >= 10_000 or e["problem"] == "gauss2d 7x7"
        # SciPy's loop runs in float64 at its own tolerances: a float32 row against it
        # compares unlike things (our float32 stops near 1e-6, SciPy's at 1.49e-8), so it
        # is shown without a target.
        like = e["dtype"] == "torch.float64"
        versus = "SciPy loop (float64)" if like else "SciPy loop (float64; not like for like)"
        rows.append(
            row(
                f"{label}: ours / {versus}",
                e["ratio_vs_scipy_loop"],
                SCIPY_TARGET if big and like else None,
                op="≥",
                detail=f"ours {ours['fits_per_s']:,.0f} fits/s with default arguments ("
                f"{ours['fits_per_s_more_threads']:,.0f} on {ours['threads']} threads), coverage "
                f"{ours['coverage_2se']:.3f}; {load}",
            )
        )
        if "ratio_vs_torchimize" in e:
            rows.append(
                row(
                    f"{label}: ours / torchimize at M={e['torchimize']['fits_timed']:,}",
                    e["ratio_vs_torchimize"],
                    PEER_TARGET if big else None,
                    op="≥",
                    detail=f"torchimize {e['torchimize']['fits_per_s']:,.0f} fits/s, "
                    f"{e['torchimize']['iterations']} iterations",
                )
            )
    return rows


def _ours_text(ours: dict[str, Any]) -> str:
    more = ours.get("fits_per_s_more_threads")
    return f"{ours['fits_per_s']:,.0f}" + (f" ({more:,.0f})" if more else "")


def section(results: dict[str, Any]) -> str:
    out = [
        f"Device {results['device']}; {results['machine']['cpu']}. 2-D Gaussian on 5 × 5 pixels "
        "(Gpufit's problem), on 7 × 7 pixels at M = 4,000, and a 3-parameter decay on 64 points per pixel of an image; "
        "SciPy and our single curve_fit timed in a loop and extrapolated; coverage: the "
        "fraction of estimates within 2 standard errors of the truth.",
        "",
        "| problem | M | dtype | ours fits/s, default args (2 threads) | SciPy loop fits/s | torchimize fits/s | our curve_fit loop fits/s | "
        "ours / SciPy | ours / torchimize | coverage (ours) | coverage (SciPy) | max rel. popt diff to SciPy | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in results["cases"]:
        ref = results["loops"][_loop_key(e["problem"])]
        peer = e.get("torchimize")
        scipy = e.get("scipy_loop", {})
        diff = scipy.get("max_relative_popt_difference")
        cells = [
            e["problem"],
            f"{e['fits']:,}",
            e["dtype"].replace("torch.", ""),
            _ours_text(e["ours"]),
            f"{ref['scipy_loop']['fits_per_s']:,.0f}",
            f"{peer['fits_per_s']:,.0f}" if peer else "—",
            f"{ref['our_loop']['fits_per_s']:,.0f}",
            f"{e['ratio_vs_scipy_loop']:.1f}×",
            f"{e['ratio_vs_torchimize']:.1f}×" if peer else "—",
            f"{e['ours']['coverage_2se']:.3f}",
            f"{ref['scipy_loop']['coverage_2se']:.3f}",
            f"{diff:.1e} (median {scipy['median_relative_popt_difference']:.1e})"
            if diff is not None
            else "—",
            f"{e['load_before']:.1f} → {e['load_after']:.1f}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick, device=o.device)
