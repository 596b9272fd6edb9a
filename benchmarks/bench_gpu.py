"""LM on a GPU: step time, time to quality, GPU memory and host synchronisations (issue 18).

Everything runs in one process on one device (``--device``, ``cuda:0`` by default), float32
models and Jacobians, against torch-levenberg-marquardt driven as in ``bench_step.py``
(``_versus.py``: same parameters, same batches, steps interleaved; the clock is read after
``torch.cuda.synchronize``).

* Step time on ``y = sinc(10 x)``: 1-256-1 (P = 769) at N = 10000 and 100000; 1-128-128-1
  (P = 16,897) at N = 2000 and 20000; 1-128-128-128-128-1 (P = 49,921) at N = 2000, 10000
  and the largest N whose whole Jacobian the planner fits on the device
  (``marquardt.devices.plan(P, N, strategy="explicit")``, bisected on N; with
  ``accumulate`` every N fits, so the bound that matters is J held whole, as the peer
  holds it). Ours: ``LMA(model, [device], a - b)`` with its defaults, no ``slice_size``.
  Medians of up to ``STEPS`` timed steps after one warm-up, and no new step once a
  shape's cap has passed. The floor on the same device: the fastest of torch ``mm`` and
  cuBLAS ``ssyrk`` (through CuPy, where installed) forming ``JᵀJ`` or ``JJᵀ`` of a random
  float32 J of that shape, plus one float64 Cholesky solve (``_floor.py``).
* Peak GPU memory of each side: in a clean allocator (gc, ``empty_cache``), from the
  memory allocated before the optimizer is built, ``torch.cuda.max_memory_allocated``
  over building it and one step, the peak statistics reset between the sides; then the
  optimizer is deleted and the allocated memory must return to where it was.
* Time to quality on the seed's loop (cuPyLMA's sinc tutorial): 1-64-1, 100000 points,
  shuffled batches of 10000 moved to the device each step, ours with ``slice_size=5000``;
  training wall time until the MSE on all points reaches 1e-3 … 1e-6 (the clock stops for
  the evaluations), each side in turn, capped.
* curve_fit (``bench_curve_fit.py``'s Gaussian plus offset, N = 10⁴ … 10⁷): ours on the
  device against SciPy's ``curve_fit`` (lm, trf) on the host; target ≤ 0.5× at every N.
* Host synchronisations in one of our steps on that loop (after a warm-up step), counted
  with ``torch.cuda.set_sync_debug_mode("warn")``; the peer's for reference.
* The newer capabilities, each by its own benchmark on the same device (``NEWER``):
  single small fits against SciPy (``bench_small_fit.py``), many fits at once
  (``bench_batch_fit.py``) and the physics-informed network's LM step against the peer
  (``bench_pinn.py``), and matrix-free LM on the large network against Adam
  (``_gpu_matrix_free.py``), at their quick sizes unless ``--newer-full``; a benchmark
  that is not in the tree is recorded as absent.

Each shape and part is guarded: an out-of-memory error or any failure is recorded and the
run goes on. ``--budget`` (seconds) bounds the whole run: parts and shapes get caps from
what is left, and a shape with too little time left is recorded as skipped.

Targets: ours ≤ 0.5× the peer's step and ≤ 1.5× the floor; time to 1e-6 ≤ 0.5× the peer's;
peak GPU memory ≤ the peer's; memory back to its baseline after deleting the LMA.
``python benchmarks/bench_gpu.py [--device cuda:0] [--quick] [--out DIR] [--md FILE]``
writes ``gpu.json`` and ``gpu.png`` into ``--out`` (default ``benchmarks/results``) and
``RESULTS-gpu.md`` (``--md``); ``--render gpu.json`` rewrites the last two from a JSON.
``--device cpu --quick`` exercises every code path on tiny shapes, without a GPU.
``--only core`` or ``--only newer`` runs one of the two halves (two shorter GPU calls).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import inspect
import json
import platform
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _common as c
import _gpu_report as report
import _versus as v
import bench_curve_fit
import torch
from _floor import random_floor

#: Stands for "the largest N the planner fits" in a shape list.
LARGEST = 0
# (widths, N)
SHAPES: tuple[tuple[tuple[int, ...], int], ...] = (
    ((1, 256, 1), 10_000),
    ((1, 256, 1), 100_000),
    ((1, 128, 128, 1), 2_000),
    ((1, 128, 128, 1), 20_000),
    ((1, 128, 128, 128, 128, 1), 2_000),
    ((1, 128, 128, 128, 128, 1), 10_000),
    ((1, 128, 128, 128, 128, 1), LARGEST),
)
# Development only (--quick): one over- and one under-determined shape of each kind.
QUICK_SHAPES: tuple[tuple[tuple[int, ...], int], ...] = (
    ((1, 16, 1), 2_000),
    ((1, 16, 1), 5_000),
    ((1, 24, 24, 1), 300),
    ((1, 24, 24, 1), 1_000),
    ((1, 24, 24, 1), LARGEST),
)
QUICK_LARGEST = 1_500
CPU_LARGEST = 20_000
STEPS = 15
WARMUP = 1
SHAPE_CAP = 30.0
LARGEST_CAP = 150.0
FLOOR_REPEATS = 5
QUALITY_HIDDEN = 64
QUALITY_SLICE = 5_000
QUALITY_CAP = 60.0
THRESHOLDS = (1e-3, 1e-4, 1e-5, 1e-6)
BUDGET = 450.0
MIN_SHAPE_SECONDS = 15.0
#: The newer capabilities' benchmarks: (key in the JSON, module). Each module has
#: ``main(quick=, device=[, budget=])``, ``summary(results)`` and ``section(results)``.
NEWER: tuple[tuple[str, str], ...] = (
    ("small_fit", "bench_small_fit"),
    ("batch_fit", "bench_batch_fit"),
    ("pinn", "bench_pinn"),
    ("matrix_free", "_gpu_matrix_free"),
)
#: Seconds per method of bench_pinn.py when it runs here (it runs each method for that long,
#: after an Adam learning-rate sweep of four runs of a quarter of it, each in a process of
#: its own that starts CUDA): about 10 × this in all.
PINN_SECONDS = 10.0
PARTS = ("all", "core", "newer")


# -- the device and the machine ----------------------------------------------------------
def _driver_version() -> str:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            return done.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            return "unknown"


def _version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "not installed"


def machine(device: torch.device, source: str) -> dict[str, Any]:
    """What the figures were measured on, and from which source."""
    info: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "source": source or c.source_revision(),
        "device": str(device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_levenberg_marquardt": _version("torch-levenberg-marquardt"),
        "cupy": _version("cupy-cuda13x")
        if _version("cupy-cuda13x") != "not installed"
        else _version("cupy-cuda12x"),
        "cpu": c.machine()["cpu"],
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            driver=_driver_version(),
        )
    return info


def largest_batch(
    params: int, device: torch.device, clip: int | None
) -> tuple[int, list[str], str]:
    """The largest N whose whole float32 J (explicit strategy) the planner fits on ``device``.

    Bisected on ``marquardt.devices.plan(params, N, strategy="explicit").fits``, with the
    device's free memory as NVML reports it now (the host's for ``cpu``). Returns N, the
    plan's explanation at that N, and a note when ``clip`` lowered it.
    """
    from marquardt.devices import discover_gpus, plan

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        gpus = [g for g in discover_gpus() if g.ordinal == index]
        if not gpus:
            raise RuntimeError(f"NVML lists no GPU with ordinal {index} for {device}")
    else:
        gpus = []

    def fits(n: int) -> bool:
        return plan(params, n, 1, "float32", gpus, strategy="explicit").fits

    if not fits(1):
        return 0, list(plan(params, 1, 1, "float32", gpus, strategy="explicit").lines), ""
    lo, hi = 1, max(2, params)
    while fits(hi) and hi < 2**31:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    note = ""
    if clip is not None and lo > clip:
        lo, note = clip, f"the planner's {lo:,} clipped to {clip:,} on this device"
    return lo, list(plan(params, lo, 1, "float32", gpus, strategy="explicit").lines), note


# -- one shape -------------------------------------------------------------------------------
def _batches(n: int, count: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` shuffled batches of ``n`` sinc points (at least the seed's 100000 points)."""
    x_all, y_all = c.sinc_dataset(max(c.DATASET_SIZE, n))
    batches = c.shuffled_batches(x_all, y_all, n)
    return [(x.to(device), y.to(device)) for x, y in (next(batches) for _ in range(count))]


def gpu_memory(
    make: Callable[[Sequence[int], torch.device], tuple[v.Step, Any]],
    widths: Sequence[int],
    device: torch.device,
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, Any]:
    """Peak GPU memory of building one side and one step, and what is left once deleted."""
    v.release(device)
    base = torch.cuda.memory_allocated(device)
    reserved_before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    peak: int | None = None
    seconds: float | None = None
    error = ""
    try:
        step, owner = make(widths, device)
        c.synchronize(device)
        start = time.perf_counter()
        step(x, y)
        c.synchronize(device)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device) - base
        del step, owner
    except Exception as exc:  # out of memory included: the result says so
        error = v.describe_error(exc)
    v.release(device)
    after = torch.cuda.memory_allocated(device)
    return {
        "base_bytes": base,
        "peak_bytes": peak,
        "after_delete_bytes": after,
        "leftover_bytes": after - base,
        "reserved_before_bytes": reserved_before,
        "reserved_after_empty_cache_bytes": torch.cuda.memory_reserved(device),
        "first_step_seconds": seconds,
        "error": error,
    }


def measure_shape(
    widths: Sequence[int], n: int, device: torch.device, cap: float
) -> dict[str, Any]:
    """GPU memory of each side, interleaved steps, and the floor, for one shape."""
    params = c.mlp_params(widths)
    start = time.perf_counter()
    entry: dict[str, Any] = {
        "widths": list(widths),
        "params": params,
        "n": n,
        "system": "P × P (JᵀJ)" if n >= params else "N × N (JJᵀ)",
        "cap_seconds": cap,
    }
    pairs = _batches(n, WARMUP + STEPS, device)
    makers = {"ours": v.make_ours, "peer": v.make_peer}
    warmup = WARMUP
    if device.type == "cuda":
        memory = {
            side: gpu_memory(make, widths, device, *pairs[0]) for side, make in makers.items()
        }
        entry["memory"] = memory
        # The memory phase warmed the kernels; a slow first step needs no second warm-up.
        first = [m["first_step_seconds"] or 0.0 for m in memory.values()]
        if max(first) > cap / 6:
            warmup = 0
    entry["warmup"] = warmup
    sides: dict[str, v.Step] = {}
    owners: list[Any] = []
    skipped: dict[str, str] = {}
    for side, make in makers.items():
        failed = entry.get("memory", {}).get(side, {}).get("error", "")
        if failed:  # it would only fail again, at the cost of the time cap
            skipped[side] = f"not timed: its memory step failed ({failed})"
            continue
        step, owner = make(widths, device)
        sides[side], owners = step, [*owners, owner]
    runs = v.interleave(
        sides,
        pairs[WARMUP - warmup :],
        warmup=warmup,
        device=device,
        cap=max(1.0, cap - (time.perf_counter() - start)) * 0.6,
    )
    ours_owner = owners[0] if "ours" in sides else None
    lma_report = getattr(ours_owner, "report", None)
    entry["ours_runs"] = (
        f"strategy {lma_report.strategy}, backend {lma_report.backend}" if lma_report else ""
    )
    del sides, owners, ours_owner, pairs
    v.release(device)
    for side in makers:
        record = runs.get(side, {"seconds": [], "reports": [], "error": skipped.get(side, "")})
        entry[side] = {
            "steps": record["seconds"],
            "error": record["error"],
            "median": v.medians(record) if record["seconds"] else {},
        }
    left = max(1.0, cap - (time.perf_counter() - start))
    try:
        entry["floor"] = random_floor(n, params, device, FLOOR_REPEATS, warmup=1, budget=left / 6)
    except Exception as exc:  # out of memory included
        entry["floor"] = {"error": v.describe_error(exc)}
        v.release(device)
    entry["seconds"] = time.perf_counter() - start
    return entry


# -- time to quality ---------------------------------------------------------------------
def _quality_side(kind: str, device: torch.device) -> tuple[Callable[..., bool], Any]:
    model = c.sinc_model(QUALITY_HIDDEN).to(device)
    if kind == "ours":
        from marquardt.solver import LMA

        lma = LMA(model, [device], v.residual)
        return (lambda x, y: lma.step(x, y, QUALITY_SLICE)[1]), lma.model
    tlm = c.import_peer()
    module = tlm.training.LevenbergMarquardtModule(model, solve_method="cholesky")
    return (lambda x, y: bool(module.training_step(x, y)[2])), module.model


def time_to_quality(kind: str, device: torch.device, cap: float) -> dict[str, Any]:
    """Training wall time until the full-dataset MSE reaches each threshold (capped)."""
    x_all, y_all = c.sinc_dataset()
    x_dev, y_dev = x_all.to(device), y_all.to(device)
    step, evaluated = _quality_side(kind, device)
    batches = c.shuffled_batches(x_all, y_all, c.BATCH)
    trace: list[tuple[float, int, float]] = [(0.0, 0, c.full_mse(evaluated, x_dev, y_dev))]
    reached: dict[str, float | None] = {f"{t:g}": None for t in THRESHOLDS}
    train, steps, stopped = 0.0, 0, "time cap"
    while train < cap:
        c.synchronize(device)
        start = time.perf_counter()
        x, y = next(batches)
        terminated = step(x.to(device), y.to(device))
        c.synchronize(device)
        train += time.perf_counter() - start
        steps += 1
        mse = c.full_mse(evaluated, x_dev, y_dev)
        trace.append((train, steps, mse))
        for t in THRESHOLDS:
            if reached[f"{t:g}"] is None and mse <= t:
                reached[f"{t:g}"] = train
        if mse <= THRESHOLDS[-1]:
            stopped = "reached every threshold"
            break
        if terminated:
            stopped = "the optimizer terminated"
            break
        if mse != mse:
            stopped = "MSE is NaN"
            break
    return {
        "kind": kind,
        "cap_seconds": cap,
        "train_seconds": train,
        "steps": steps,
        "final_mse": trace[-1][2],
        "stopped": stopped,
        "reached": reached,
        "trace": trace,
    }


# -- host synchronisations ---------------------------------------------------------------
def _site(w: warnings.WarningMessage) -> str:
    path = str(w.filename)
    for marker in ("site-packages/", "/src/", "/lib/python"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{w.lineno}"


def count_syncs(device: torch.device) -> dict[str, Any]:
    """Host synchronisations in one LM step (after a warm-up step) on the quality loop."""
    if device.type != "cuda":
        return {"note": f"counted on CUDA only (device {device})"}
    x_all, y_all = c.sinc_dataset()
    batches = c.shuffled_batches(x_all, y_all, c.BATCH)
    out: dict[str, Any] = {}
    for kind in ("ours", "peer"):
        try:
            step, _model = _quality_side(kind, device)
            x, y = (t.to(device) for t in next(batches))
            step(x, y)
            x, y = (t.to(device) for t in next(batches))
            torch.cuda.synchronize(device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step(x, y)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [w for w in caught if "synchroniz" in str(w.message)]
            sites = Counter(_site(w) for w in syncs)
            out[kind] = {"count": len(syncs), "sites": dict(sites.most_common(12))}
        except Exception as exc:
            out[kind] = {"count": None, "error": v.describe_error(exc)}
        v.release(device)
    return out


# -- the run ---------------------------------------------------------------------------------
class Deadline:
    """What is left of the run's time budget."""

    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget

    def left(self) -> float:
        return self.end - time.monotonic()


def main(
    device: str = "cuda:0",
    quick: bool = False,
    out: Path = c.RESULTS_DIR,
    md: Path | None = None,
    budget: float = BUDGET,
    source: str = "",
    largest: int | None = None,
    only: str = "all",
    newer_full: bool = False,
) -> dict[str, Any]:
    if only not in PARTS:
        raise SystemExit(f"bench_gpu: --only {only!r}: choose one of {', '.join(PARTS)}")
    where = torch.device(device)
    if where.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"bench_gpu: --device {device} was asked but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}). HINT: run it on "
            "a machine with an NVIDIA GPU, or pass --device cpu --quick for a dry run"
        )
    if where.type == "cpu":
        c.setup_threads()
    deadline = Deadline(budget)
    suffix = "-quick" if quick else ""
    paths = {
        "json": out / f"gpu{suffix}.json",
        "png": out / f"gpu{suffix}.png",
        "md": md or c.HERE / f"RESULTS-gpu{suffix}.md",
    }
    results: dict[str, Any] = {
        "problem": "sinc(10x), tanh MLPs, float32",
        "quick": quick,
        "budget_seconds": budget,
        "machine": machine(where, source),
        "ours_config": "LMA defaults (Nielsen damping, Marquardt scaling, strategy and "
        "backend auto); steps without slice_size, the quality loop with slice_size=5000",
        "peer_config": "LevenbergMarquardtModule(solve_method='cholesky'), defaults otherwise",
        "targets": {
            "ours_vs_peer": report.TARGET_PEER,
            "ours_vs_floor": report.TARGET_FLOOR,
            "time_to_1e-6_ours_vs_peer": report.TARGET_QUALITY,
            "peak_memory_ours_vs_peer": report.TARGET_MEMORY,
        },
        "shapes": {},
        "quality": {},
        "syncs": {},
        "newer": {},
        "parts": only,
    }
    started = time.monotonic()

    def save() -> None:
        results["seconds"] = time.monotonic() - started
        report.write(results, paths)

    def run_newer() -> dict[str, Any]:
        for key, module in NEWER:
            results["newer"][key] = newer_part(module, where, quick and not newer_full)
            save()
        return results

    if only == "newer":
        return run_newer()

    # The largest N first, from NVML's free memory before this process allocates any.
    shapes = QUICK_SHAPES if quick else SHAPES
    clip = largest or (QUICK_LARGEST if quick else CPU_LARGEST if where.type == "cpu" else None)
    big = max(c.mlp_params(w) for w, n in shapes if n == LARGEST)
    try:
        n_max, lines, note = largest_batch(big, where, clip)
        results["largest"] = {"params": big, "n": n_max, "plan": lines, "note": note}
    except Exception as exc:
        results["largest"] = {"params": big, "n": 0, "error": v.describe_error(exc)}
    _warm(where)

    results["syncs"] = count_syncs(where)
    save()
    quality_cap = 3.0 if quick else QUALITY_CAP
    for kind in ("ours", "peer"):
        cap = max(1.0, min(quality_cap, deadline.left() * 0.2))
        try:
            results["quality"][kind] = time_to_quality(kind, where, cap)
        except Exception as exc:
            results["quality"][kind] = {"kind": kind, "error": v.describe_error(exc)}
        v.release(where)
        save()
    results["curve_fit"] = curve_fit_part(where, quick)
    save()
    for widths, n in shapes:
        is_largest = n == LARGEST
        if is_largest:
            n = results["largest"]["n"]
        name = f"{c.mlp_name(widths)} N={'largest' if is_largest and not n else n}"
        left = deadline.left()
        cap = min(LARGEST_CAP if is_largest else SHAPE_CAP, left - 5.0)
        if quick:
            cap = min(cap, 6.0)
        if not n or cap < (2.0 if quick else MIN_SHAPE_SECONDS):
            why = (
                results["largest"].get("error") or "no N fits on the device"
                if not n
                else f"skipped: {left:.0f} s of the budget left"
            )
            results["shapes"][name] = {
                "widths": list(widths),
                "params": c.mlp_params(widths),
                "n": n,
                "largest": is_largest,
                "error": why,
            }
            continue
        try:
            entry = measure_shape(widths, n, where, cap)
        except Exception as exc:  # one shape's failure is a result; the others still run
            entry = {
                "widths": list(widths),
                "params": c.mlp_params(widths),
                "n": n,
                "error": v.describe_error(exc),
            }
        entry["largest"] = is_largest
        results["shapes"][name] = entry
        v.release(where)
        save()
    if only == "all":
        return run_newer()
    save()
    return results


def newer_part(module_name: str, device: torch.device, quick: bool) -> dict[str, Any]:
    """One newer capability's benchmark on ``device``: its results, or why there are none."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        return {"module": module_name, "absent": f"{module_name} is not in this tree ({exc})"}
    kwargs: dict[str, Any] = {"quick": quick, "device": device.type}
    if "budget" in inspect.signature(module.main).parameters:
        kwargs["budget"] = PINN_SECONDS / (2.0 if quick else 1.0)
    try:
        results = module.main(**kwargs)
        return {"module": module_name, "results": results}
    except Exception as exc:  # a failure is a result; the rest of the run goes on
        return {"module": module_name, "error": v.describe_error(exc)}
    finally:
        v.release(device)


def curve_fit_part(device: torch.device, quick: bool) -> dict[str, Any]:
    """``bench_curve_fit.py``'s problem with ours on ``device`` and SciPy on the host; on a
    GPU the target (ours ≤ 0.5× SciPy) holds at every N."""
    try:
        target_from = 0 if device.type == "cuda" else bench_curve_fit.TARGET_FROM
        return bench_curve_fit.run(device, quick=quick, target_from=target_from)
    except Exception as exc:  # a failure is a result; the rest of the run goes on
        return {"error": v.describe_error(exc)}
    finally:
        v.release(device)


def _warm(device: torch.device) -> None:
    """Create the cuBLAS and cuSOLVER handles before any memory baseline is taken."""
    a = torch.randn(64, 64, device=device)
    (a @ a.T).sum().item()
    spd = (a @ a.T).double() + 64 * torch.eye(64, dtype=torch.float64, device=device)
    torch.linalg.cholesky(spd).sum().item()
    v.release(device)


def _cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0", help="torch device (cuda:0)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (development)")
    parser.add_argument(
        "--out", type=Path, default=c.RESULTS_DIR, help="folder for gpu.json and gpu.png"
    )
    parser.add_argument("--md", type=Path, default=None, help="the Markdown report's path")
    parser.add_argument("--budget", type=float, default=BUDGET, help="seconds for the run")
    parser.add_argument("--source", default="", help="what was measured (default: git)")
    parser.add_argument("--largest", type=int, default=None, help="clip the largest N to this")
    parser.add_argument("--render", type=Path, default=None, help="rewrite the report from JSON")
    parser.add_argument(
        "--only",
        choices=PARTS,
        default="all",
        help="core: the LM shapes, quality, curve_fit, "
        "syncs; newer: the small, batched and PINN benchmarks",
    )
    parser.add_argument(
        "--newer-full", action="store_true", help="the newer benchmarks at full size"
    )
    args = parser.parse_args()
    if args.render is not None:
        results = json.loads(args.render.read_text())
        suffix = "-quick" if results.get("quick") else ""
        report.write(
            results,
            {
                "json": args.out / f"gpu{suffix}.json",
                "png": args.out / f"gpu{suffix}.png",
                "md": args.md or c.HERE / f"RESULTS-gpu{suffix}.md",
            },
        )
        report.print_summary(results)
        return 0
    results = main(
        device=args.device,
        quick=args.quick,
        out=args.out,
        md=args.md,
        budget=args.budget,
        source=args.source,
        largest=args.largest,
        only=args.only,
        newer_full=args.newer_full,
    )
    report.print_summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
