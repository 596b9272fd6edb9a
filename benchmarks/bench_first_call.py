"""A new model's first call with default arguments, against the eager first call.

The model is new to the machine: an elliptic 2-D Gaussian, a·exp(−(x − x₀)²/(2sₓ²) −
(y − y₀)²/(2s_y²)) + b (6 parameters), on 6 × 6 pixels; amplitude 500, centre 2.5 ± 0.5,
widths 1 ± 10 %, offset 10, Poisson counts; starts: amplitude, widths and offset ×
U(0.8, 1.2), centre ± U(−0.3, 0.3). Each row (M fits, a dtype) runs three fresh processes
one after the other:

* ``eager``: an empty cache folder of its own, ``compile=False``: its first call (what a
  user pays without compiling) and a later call;
* ``first``: another empty cache folder, default arguments (``compile="auto"``): its first
  call (which runs eagerly and starts the kernels' background builds, tracing included),
  then it waits for its builds and records their time (``build_s``: from the call's end to
  the last build's end, one compile at a time at low priority);
* ``second``: the first's cache folder, default arguments: its first call (loading the
  kept kernels) and a later call.

Target: the first call of ``first`` ≤ 1.5× the eager first call in every row. Shown
beside it: the build time, and the second process's later call against the eager later
call (the compiled speed the wait bought). Rows: M = 10³, 10⁴, 10⁵ in float32
(``ROWS``); the same in float64 is ``first_call_f64`` and M = 10⁶ in both
``first_call_large``, runs of their own so that each stays within ten minutes (every row
waits for its own builds, a minute or more here); ``--quick``: M = 10³, float32. Every
figure is one call in one fresh process (no repeats).

``python benchmarks/run_all.py first_call [--quick]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import _machine
import numpy as np
import torch
from _registry import Options
from _rows import row

#: (M, dtype) of a full run, and of a quick one.
ROWS = ((1_000, "float32"), (10_000, "float32"), (100_000, "float32"))
QUICK_ROWS = ((1_000, "float32"),)
TARGET = 1.5
#: The rows (M up to this) whose second process makes a third call under a busy loop.
BUSY_FITS = 10_000
#: Seconds a child process may take (a first process waits for its builds).
CHILD_TIMEOUT = 900.0
SIDE = 6


def elliptic(xy: torch.Tensor, a: Any, x0: Any, y0: Any, sx: Any, sy: Any, b: Any) -> torch.Tensor:
    """The elliptic 2-D Gaussian (module docstring), x the fast index of ``xy``."""
    return a * torch.exp(-0.5 * (((xy[0] - x0) / sx) ** 2 + ((xy[1] - y0) / sy) ** 2)) + b


def problem(fits: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The pixels ``x`` (2, 36), the counts ``y`` (M, 36) and the starts ``p0`` (M, 6)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.arange(SIDE, dtype=float), np.arange(SIDE, dtype=float), indexing="ij")
    x = np.stack([xx.ravel(), yy.ravel()])
    centre = (SIDE - 1) / 2
    true = np.c_[
        np.full(fits, 500.0),
        centre + rng.uniform(-0.5, 0.5, (fits, 2)),
        rng.uniform(0.9, 1.1, (fits, 2)),
        np.full(fits, 10.0),
    ]
    with torch.no_grad():
        clean = elliptic(torch.from_numpy(x), *torch.from_numpy(true.T[..., None])).numpy()
    y = rng.poisson(clean).astype(np.float64)
    p0 = true.copy()
    p0[:, [0, 3, 4, 5]] *= rng.uniform(0.8, 1.2, (fits, 4))
    p0[:, 1:3] += rng.uniform(-0.3, 0.3, (fits, 2))
    return {"x": x, "y": y, "p0": p0}


def _call(data: dict[str, np.ndarray], dtype: str, **options: Any) -> tuple[float, dict[str, Any]]:
    from marquardt.solver import curve_fit_batch

    kind = getattr(torch, dtype)
    x, y, p0 = (torch.from_numpy(data[k]).to(kind) for k in ("x", "y", "p0"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        _, _, info = curve_fit_batch(elliptic, x, y, p0, full_output=True, **options)
    return time.perf_counter() - start, info


def process(kind: str, fits: int, dtype: str) -> dict[str, Any]:
    """One fresh process of a row (module docstring): ``eager``, ``first`` or ``second``."""
    from marquardt.solver._curve.kernel_cache import background

    data = problem(fits)
    options = {"compile": False} if kind == "eager" else {}
    first_s, info = _call(data, dtype, **options)
    out: dict[str, Any] = {
        "first_s": first_s,
        "compiled": bool(info["compiled"]),
        "compile_s": float(info["compile_seconds"]),
    }
    if kind == "first":
        started = time.perf_counter()
        out["builds_ended"] = background.wait()
        out["build_s"] = time.perf_counter() - started
    else:
        out["later_s"], info = _call(data, dtype, **options)
        out["later_compiled"] = bool(info["compiled"])
    if kind == "second" and fits <= BUSY_FITS:
        out["busy"] = _under_load(data, dtype)
    return out


def _under_load(data: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    """A third call of the second process with a busy loop on every core started after the
    second: what it compiled (in the call or in the background) and its time."""
    from marquardt.solver._curve.kernel_cache import artifacts, background

    compiled, builds = artifacts.STATS["compiled"], len(background._STARTED)
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        time.sleep(1.0)  # the load the thread rule reads (runnable threads) is there now
        seconds, info = _call(data, dtype)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return {
        "s": seconds,
        "compiled": bool(info["compiled"]),
        "compile_s": float(info["compile_seconds"]),
        "new_kernels": artifacts.STATS["compiled"] - compiled,
        "new_builds": len(background._STARTED) - builds,
    }


def case(fits: int, dtype: str) -> dict[str, Any]:
    """One row: the three processes, each fresh (module docstring)."""
    import _child

    out: dict[str, Any] = {"fits": fits, "dtype": dtype, "load_before": _machine.load_average()}
    with tempfile.TemporaryDirectory() as eager_cache, tempfile.TemporaryDirectory() as cache:
        for kind, folder in (("eager", eager_cache), ("first", cache), ("second", cache)):
            env = {**os.environ, "MARQUARDT_CACHE_DIR": folder}
            env.pop("MARQUARDT_SOLVER_BACKGROUND_BUILD", None)
            result, error = _child.call(
                "bench_first_call", "process", [kind, fits, dtype], timeout=CHILD_TIMEOUT, env=env
            )
            if error:
                raise RuntimeError(f"first_call M={fits} {dtype}, {kind} process: {error}")
            out[kind] = result
    out["load_after"] = _machine.load_average()
    out["first_vs_eager"] = out["first"]["first_s"] / out["eager"]["first_s"]
    out["second_later_vs_eager_later"] = out["second"]["later_s"] / out["eager"]["later_s"]
    print(
        f"  M={fits:,} {dtype}: eager first {out['eager']['first_s']:.2f} s, default first "
        f"{out['first']['first_s']:.2f} s ({out['first_vs_eager']:.2f}×), builds "
        f"{out['first']['build_s']:.1f} s, second process later {out['second']['later_s']:.2f} s "
        f"vs eager later {out['eager']['later_s']:.2f} s; load {out['load_before']:.1f}",
        flush=True,
    )
    return out


def main(quick: bool = False, rows: Any = None) -> dict[str, Any]:
    """Every row of the run (module docstring)."""
    chosen = [tuple(r) for r in rows] if rows is not None else QUICK_ROWS if quick else ROWS
    machine = _machine.describe()
    return {
        "quick": quick,
        "machine": {k: machine[k] for k in ("cpu", "cores", "torch")},
        "rows": [case(int(fits), str(dtype)) for fits, dtype in chosen],
    }


def rows(summary: dict[str, Any]) -> list[Any]:
    """The first call against the eager first call, per row."""
    found = []
    for r in summary["rows"]:
        label = f"first call M={r['fits']:,} {r['dtype']}"
        found.append(
            row(
                f"{label}: default (empty cache) / eager first call",
                r["first_vs_eager"],
                TARGET,
                detail=f"{r['first']['first_s']:.2f} s vs {r['eager']['first_s']:.2f} s; "
                f"background build {r['first']['build_s']:.0f} s; second process's later call "
                f"{r['second_later_vs_eager_later']:.2f}× the eager later call "
                f"(compiled: {r['second']['later_compiled']}); load {r['load_before']:.1f} → "
                f"{r['load_after']:.1f}",
            )
        )
        busy = r["second"].get("busy")
        if busy is not None:
            found.append(
                row(
                    f"{label}: a busy loop started between two calls of one process: kernels "
                    "compiled (in the call or in the background)",
                    busy["new_kernels"] + busy["new_builds"],
                    0,
                    unit="",
                    detail=f"the call under load {busy['s']:.2f} s, compiled: {busy['compiled']}, "
                    f"compile {busy['compile_s']:.1f} s",
                )
            )
    return found


def section(summary: dict[str, Any]) -> str:
    """The rows as a Markdown table, with the machine."""
    machine = summary["machine"]
    head = [
        "M",
        "dtype",
        "eager first / later (s)",
        "default first (s)",
        "÷ eager first",
        "background build (s)",
        "second process first / later (s)",
        "later ÷ eager later",
        "load",
    ]
    lines = [
        f"CPU {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}. Each "
        "column a fresh process; one call each, not repeated.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in summary["rows"]:
        e, f, s = r["eager"], r["first"], r["second"]
        cells = [
            f"{r['fits']:,}",
            r["dtype"],
            f"{e['first_s']:.2f} / {e['later_s']:.2f}",
            f"{f['first_s']:.2f}",
            f"{r['first_vs_eager']:.2f}",
            f"{f['build_s']:.0f}",
            f"{s['first_s']:.2f} / {s['later_s']:.2f}",
            f"{r['second_later_vs_eager_later']:.2f}",
            f"{r['load_before']:.1f} → {r['load_after']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick)
