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

On a GPU (``--device cuda``) the fits and data are on the device and each call's clock
stops after the device has finished. A default call there builds nothing in the background
(background builds are the CPU's) and compiles inline only where the call repays it, so a
fourth process runs between ``first`` and ``second``:

* ``build``: the first's cache folder, ``compile=True``: its first call (inductor's and
  Triton's compile of the kernels, then the fits) and a later call; ``second`` then loads
  the kernels it kept.

Row: M = 10⁵ in float32 (``GPU_ROWS``; ``--quick``: 10³), the figures of the CPU's rows and
the compiling first call against the eager first call, with its compile's seconds.

``python benchmarks/run_all.py first_call [--quick] [--device cuda]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
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

#: (M, dtype) of a full run, and of a quick one.
ROWS = ((1_000, "float32"), (10_000, "float32"), (100_000, "float32"))
QUICK_ROWS = ((1_000, "float32"),)
#: The same on a GPU: one row each.
GPU_ROWS = ((100_000, "float32"),)
GPU_QUICK_ROWS = QUICK_ROWS
#: The processes of a row, in turn, by device type (module docstring).
KINDS = {"cpu": ("eager", "first", "second"), "cuda": ("eager", "first", "build", "second")}
#: Each kind's keywords for ``curve_fit_batch`` (none: the defaults).
OPTIONS: dict[str, dict[str, Any]] = {"eager": {"compile": False}, "build": {"compile": True}}
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


def timed_call(
    f: Callable[..., Any],
    data: dict[str, np.ndarray],
    dtype: str,
    device: str = "cpu",
    **options: Any,
) -> tuple[float, dict[str, Any]]:
    """One ``curve_fit_batch`` call of ``f`` on ``data`` (``x``, ``y``, ``p0``) in ``dtype``
    on ``device``, and its seconds (until the device has finished), its info."""
    from marquardt.solver import curve_fit_batch

    kind, where = getattr(torch, dtype), torch.device(device)
    x, y, p0 = (torch.from_numpy(np.asarray(data[k])).to(where, kind) for k in ("x", "y", "p0"))
    c.synchronize(where)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        _, _, info = curve_fit_batch(f, x, y, p0, full_output=True, **options)
        c.synchronize(where)
    return time.perf_counter() - start, info


def process(kind: str, fits: int, dtype: str, device: str = "cpu") -> dict[str, Any]:
    """One fresh process of a row (module docstring): ``eager``, ``first``, ``build`` or
    ``second``, its fits on ``device``."""
    from marquardt.solver._curve.kernel_cache import background

    data = problem(fits)
    options = OPTIONS.get(kind, {})
    first_s, info = timed_call(elliptic, data, dtype, device, **options)
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
        out["later_s"], info = timed_call(elliptic, data, dtype, device, **options)
        out["later_compiled"] = bool(info["compiled"])
    if kind == "second" and fits <= BUSY_FITS and torch.device(device).type == "cpu":
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
        seconds, info = timed_call(elliptic, data, dtype)
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


def case(
    fits: int, dtype: str, device: str = "cpu", timeout: float = CHILD_TIMEOUT
) -> dict[str, Any]:
    """One row: its processes (``KINDS``), each fresh, each given ``timeout`` seconds (module
    docstring). A GPU's ``build`` process that fails is recorded (``{"error": ...}``) and
    ends the row: the second would have nothing to load."""
    import _child

    out: dict[str, Any] = {"fits": fits, "dtype": dtype, "load_before": _machine.load_average()}
    with tempfile.TemporaryDirectory() as eager_cache, tempfile.TemporaryDirectory() as cache:
        for kind in KINDS[torch.device(device).type]:
            env = {**os.environ, "MARQUARDT_CACHE_DIR": eager_cache if kind == "eager" else cache}
            env.pop("MARQUARDT_SOLVER_BACKGROUND_BUILD", None)
            result, error = _child.call(
                "bench_first_call", "process", [kind, fits, dtype, device], timeout=timeout, env=env
            )
            if error and kind == "build":
                out["build"] = {"error": error}
                break
            if error:
                raise RuntimeError(f"first_call M={fits} {dtype}, {kind} process: {error}")
            out[kind] = result
    out["load_after"] = _machine.load_average()
    out["first_vs_eager"] = out["first"]["first_s"] / out["eager"]["first_s"]
    if "second" in out:
        out["second_later_vs_eager_later"] = out["second"]["later_s"] / out["eager"]["later_s"]
    if "first_s" in out.get("build", {}):
        out["build_vs_eager"] = out["build"]["first_s"] / out["eager"]["first_s"]
    print(f"  M={fits:,} {dtype}: {_detail(out)}", flush=True)
    return out


def _detail(r: dict[str, Any]) -> str:
    """A row's figures beside its ratio: the first calls, the build, the second process."""
    text = f"{r['first']['first_s']:.2f} s vs {r['eager']['first_s']:.2f} s; "
    if "build" in r:
        text += "no background build on the device"
    else:
        text += f"background build {r['first']['build_s']:.0f} s"
    if "second" in r:
        text += (
            f"; second process's later call {r['second_later_vs_eager_later']:.2f}× the eager "
            f"later call (compiled: {r['second']['later_compiled']})"
        )
    return text + f"; load {r['load_before']:.1f} → {r['load_after']:.1f}"


def main(
    quick: bool = False, rows: Any = None, device: str = "cpu", timeout: float = CHILD_TIMEOUT
) -> dict[str, Any]:
    """Every row of the run on ``device``, each process given ``timeout`` seconds (module
    docstring)."""
    gpu = torch.device(device).type == "cuda"
    if rows is not None:
        chosen = [tuple(r) for r in rows]
    elif gpu:
        chosen = list(GPU_QUICK_ROWS if quick else GPU_ROWS)
    else:
        chosen = list(QUICK_ROWS if quick else ROWS)
    machine = _machine.describe(device)
    return {
        "quick": quick,
        "machine": {k: machine[k] for k in ("cpu", "cores", "torch", "gpu") if k in machine},
        "rows": [case(int(fits), str(dtype), device, timeout) for fits, dtype in chosen],
    }


def rows(summary: dict[str, Any]) -> list[Any]:
    """The first call against the eager first call, per row (on a GPU also the compiling
    process and the second process's kept kernels: ``_build_rows``)."""
    found = []
    for r in summary["rows"]:
        label = f"first call M={r['fits']:,} {r['dtype']}"
        found.append(
            row(
                f"{label}: default (empty cache) / eager first call",
                r["first_vs_eager"],
                TARGET,
                detail=_detail(r),
            )
        )
        if "build" in r:
            found.extend(_build_rows(label, r))
        busy = r.get("second", {}).get("busy")
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


def _build_rows(label: str, r: dict[str, Any]) -> list[Any]:
    """A GPU row's compiling process against the eager one (no target: what compiling costs
    the first call), and the second process's kept kernels against the eager later call."""
    b, e = r["build"], r["eager"]
    ratio = f"{label}: compile=True first call (its compile in it) / eager first call"
    if "error" in b:
        return [row(ratio, None, None, detail=f"did not complete: {b['error']}")]
    s = r["second"]
    return [
        row(
            ratio,
            r["build_vs_eager"],
            None,
            detail=f"{b['first_s']:.2f} s vs {e['first_s']:.2f} s; compile "
            f"{b['compile_s']:.1f} s, compiled: {b['compiled']}; its later call "
            f"{b['later_s']:.3f} s",
        ),
        row(
            f"{label}: second process (default arguments, the kept kernels) later call / eager "
            "later call",
            r["second_later_vs_eager_later"],
            None,
            detail=f"{s['later_s']:.3f} s ({r['fits'] / s['later_s']:.3g} fits/s, compiled: "
            f"{s['later_compiled']}) vs {e['later_s']:.3f} s; its first call (the kernels' "
            f"load) {s['first_s']:.2f} s",
        ),
    ]


def section(summary: dict[str, Any]) -> str:
    """The rows as a Markdown table, with the machine."""
    machine = summary["machine"]
    built = any("build" in r for r in summary["rows"])
    head = [
        "M",
        "dtype",
        "eager first / later (s)",
        "default first (s)",
        "÷ eager first",
        "compile=True first (s): its compile" if built else "background build (s)",
        "second process first / later (s)",
        "later ÷ eager later",
        "load",
    ]
    gpu = f"GPU {machine['gpu']}; " if machine.get("gpu") else ""
    lines = [
        f"{gpu}CPU {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}. Each "
        "column a fresh process; one call each, not repeated.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in summary["rows"]:
        e, f, s = r["eager"], r["first"], r.get("second")
        cells = [
            f"{r['fits']:,}",
            r["dtype"],
            f"{e['first_s']:.2f} / {e['later_s']:.2f}",
            f"{f['first_s']:.2f}",
            f"{r['first_vs_eager']:.2f}",
            _build_cell(r),
            f"{s['first_s']:.2f} / {s['later_s']:.2f}" if s else "—",
            f"{r['second_later_vs_eager_later']:.2f}" if s else "—",
            f"{r['load_before']:.1f} → {r['load_after']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _build_cell(r: dict[str, Any]) -> str:
    """The section's build column: the background build, or a GPU's compiling process."""
    if "build" not in r:
        return f"{r['first']['build_s']:.0f}"
    if "error" in r["build"]:
        return "did not complete"
    return f"{r['build']['first_s']:.2f}: {r['build']['compile_s']:.1f}"


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it (``--budget``: the seconds each process
    may take, ``CHILD_TIMEOUT`` without it)."""
    return main(quick=o.quick, device=o.device, timeout=o.budget or CHILD_TIMEOUT)
