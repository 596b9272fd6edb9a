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
Registered as ``gpu`` (``_registry.py``): ``nox -s bench -- --device cuda gpu`` runs it
whole through ``run_all.py``, as ``gpu/run_on_gpu.sh`` does; the newer parts are the
registered benchmarks themselves, run on the device. The parts other than the step times
are in ``_gpu_parts.py``; the step times of a shape are ``_versus.measure_shape``'s, as
``bench_scale.py``'s are.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import _common as c
import _gpu_parts as parts
import _gpu_report as report
import _registry as registry
import _versus as v
import bench_curve_fit
import torch

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
SHAPE_CAP = 30.0
LARGEST_CAP = 150.0
FLOOR_REPEATS = 5
QUALITY_CAP = 60.0
BUDGET = 450.0
MIN_SHAPE_SECONDS = 15.0
#: The newer capabilities' benchmarks: (key in the JSON, name in ``_registry``).
NEWER: tuple[tuple[str, str], ...] = (
    ("small_fit", "small_fit"),
    ("batch_fit", "batch_fit"),
    ("pinn", "pinn"),
    ("matrix_free", "matrix_free_gpu"),
)
#: Seconds per method of bench_pinn.py (and of the matrix-free part) when it runs here (it runs each method for that long,
#: after an Adam learning-rate sweep of four runs of a quarter of it, each in a process of
#: its own that starts CUDA): about 10 × this in all.
PINN_SECONDS = 10.0
PARTS = ("all", "core", "newer")


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
    paths = report.paths(out, md, quick=quick)
    results: dict[str, Any] = {
        "problem": "sinc(10x), tanh MLPs, float32",
        "quick": quick,
        "budget_seconds": budget,
        "machine": parts.machine(where, source),
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
        for key, name in NEWER:
            results["newer"][key] = newer_part(name, where, quick and not newer_full)
            save()
        return results

    if only == "newer":
        return run_newer()

    # The largest N first, from NVML's free memory before this process allocates any.
    shapes = QUICK_SHAPES if quick else SHAPES
    clip = largest or (QUICK_LARGEST if quick else CPU_LARGEST if where.type == "cpu" else None)
    big = max(c.mlp_params(w) for w, n in shapes if n == LARGEST)
    try:
        n_max, lines, note = parts.largest_batch(big, where, clip)
        results["largest"] = {"params": big, "n": n_max, "plan": lines, "note": note}
    except Exception as exc:
        results["largest"] = {"params": big, "n": 0, "error": v.describe_error(exc)}
    parts.warm(where)

    results["syncs"] = parts.count_syncs(where)
    save()
    quality_cap = 3.0 if quick else QUALITY_CAP
    for kind in ("ours", "peer"):
        cap = max(1.0, min(quality_cap, deadline.left() * 0.2))
        try:
            results["quality"][kind] = parts.time_to_quality(kind, where, cap)
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
            entry = v.measure_shape(
                widths,
                n,
                where,
                steps=STEPS,
                cap=cap,
                floor_repeats=FLOOR_REPEATS,
                step_share=0.6,
                memory=parts.gpu_memory if where.type == "cuda" else None,
            )
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


def newer_part(name: str, device: torch.device, quick: bool) -> dict[str, Any]:
    """One newer capability's benchmark (``_registry`` name) on ``device``: its results,
    or why there are none."""
    module = registry.MODULES.get(name, name)
    try:
        bench = registry.get(name)
    except (KeyError, ModuleNotFoundError) as exc:
        return {"module": module, "absent": f"{name} is not in this tree ({exc})"}
    try:
        results = bench.run(quick, device.type, PINN_SECONDS / (2.0 if quick else 1.0))
        return {"module": module, "benchmark": name, "results": results}
    except Exception as exc:  # a failure is a result; the rest of the run goes on
        return {"module": module, "benchmark": name, "error": v.describe_error(exc)}
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
        report.write(results, report.paths(args.out, args.md, quick=results.get("quick", False)))
        print_summary(results)
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
    print_summary(results)
    return 0


def print_summary(results: dict[str, Any]) -> None:
    m = results["machine"]
    print(
        f"{m.get('gpu', m['device'])} ({m['device']}); driver {m.get('driver', '—')}; torch "
        f"{m['torch']}, CUDA {m['cuda']}; {m['source']}; {results.get('seconds', 0):.0f} s"
    )
    largest = results.get("largest", {})
    if largest:
        print(
            f"  largest N for P={largest['params']:,}: {largest.get('n', 0):,} "
            f"{largest.get('note') or largest.get('error', '')}".rstrip()
        )
    for name, e in results.get("shapes", {}).items():
        if "ours" in e:
            split = ", ".join(
                f"{k} {report.duration(e['ours']['median'].get(k))}"
                for k in ("jacobian", "transfer", "assembly", "solve", "trial")
            )
            print(f"  {name}: {e.get('ours_runs', '')}; ours parts {split}")
    print(c.format_rows(report.summary(results)))


def _run(quick: bool, device: str, budget: float | None) -> dict[str, Any]:
    where = "cuda:0" if device == "cuda" else device
    return main(device=where, quick=quick, budget=BUDGET if budget is None else budget)


BENCHMARK = registry.Benchmark(
    name="gpu",
    title="LM on a GPU",
    question="On one GPU: step time, time to quality, GPU memory, host synchronisations, "
    "`curve_fit`, and the newer benchmarks (small, batched, PINN, matrix-free) on the device?",
    peer="torch-levenberg-marquardt on the same GPU; the floor; SciPy on the host",
    target="≤ 0.5× the peer's step, ≤ 1.5× the floor; time to 1e-6 ≤ 0.5× the peer's; "
    "peak GPU memory ≤ the peer's; the newer benchmarks' own",
    run=_run,
    rows=report.summary,
    section=report.section,
    devices=("cuda", "cpu"),
    default=False,
    echo=print_summary,
)


if __name__ == "__main__":
    sys.exit(_cli())
