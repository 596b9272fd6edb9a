"""LM across processes: one step with 1 and with 2 gloo processes on the same global batch.

Problem: ``y = sinc(10 x)`` (the seed's 100000 points, shuffled batches of N = 20000),
float32, tanh MLPs, ``LMA(model, ["cpu"], a - b, strategy="accumulate")`` with its other
defaults (the strategy is given: with ``"auto"`` one process times the strategies and
steps matrix-free at P = 16,897, where a process group takes accumulate, so the two sides
would not run the same step):

* 1-256-1 (P = 769), the tutorial's network: 1 warm-up and 5 timed steps;
* 1-128-128-1 (P = 16,897), ``bench_scale.py``'s second shape but over-determined here
  (N = 20000 ≥ P: strategy "accumulate", a P × P system): 1 timed step of at most 1
  attempt (``LMA(attempts=1)``: each 16,897² float64 factorisation takes about a minute on
  one thread, and the target is about the Jacobian part, which the attempts do not touch).

Each process runs 1 torch thread (and 1 BLAS thread: ``OMP_NUM_THREADS=1``), except in
the third run of the first shape: 2 processes started with no thread setting at all, so
that each rank's threads are what ``LMA(process_group=...)`` chooses by the devices' thread
rule (the cores over the ranks on this host). Its Jacobian and step against the
``OMP_NUM_THREADS=1`` run of 2 processes must be ≤ 1.1× (default threads never
oversubscribe the cores). "1 process" is the plain LMA on the
whole batch (no process group); "2 processes" is ``LMA(process_group="default")`` in a
gloo group (file store) with each rank holding a contiguous half of the same batch. The
step report splits each step into the rank-local products (``seconds_jacobian +
seconds_transfer``: J of the rank's rows; ``seconds_assembly``: their JᵀJ and Jᵀr, and
the system built from the reduced products), the collective (``seconds_collective``: the all-reduce
of P² + P + 2 numbers), the damped solves (``seconds_solve``, every rank solving the same
system) and the trial forwards. For 2 processes the slower rank's figure is taken.

Target: the Jacobian part scales ≥ 1.6× from 1 to 2 processes (each computes half the
rows). The collective's share of the step is reported, and so is the alternative to
solving on every rank: rank 0 solves and broadcasts δ, which costs the same factorisation
(the other ranks wait for it) plus one broadcast of P float64 numbers per attempt, timed
here in the same group (median of 20).

``python benchmarks/run_all.py distributed [--quick]``.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import _child
import _common as c
import _machine
import torch
from _registry import Options
from _rows import row

from marquardt.testing.problems import sinc, tanh_mlp

# (widths, N, warm-up steps, timed steps)
SHAPES: tuple[tuple[tuple[int, ...], int, int, int], ...] = (
    ((1, 256, 1), 20_000, 1, 5),
    ((1, 128, 128, 1), 20_000, 0, 1),
)
QUICK_SHAPES: tuple[tuple[tuple[int, ...], int, int, int], ...] = (
    ((1, 64, 1), 4_000, 1, 3),
    ((1, 32, 32, 1), 4_000, 0, 2),
)
# Attempts per step where the damped solves would dominate the run time (default 10).
ATTEMPTS: dict[tuple[int, ...], int] = {(1, 128, 128, 1): 1}
TARGET_SCALING = 1.6
#: Default threads against OMP_NUM_THREADS=1, 2 processes: at most this (Jacobian, step).
TARGET_DEFAULT_THREADS = 1.1
#: The shapes (widths) that also run 2 processes with default threads.
DEFAULT_THREAD_SHAPES = ((1, 256, 1), (1, 64, 1))
TIMEOUT = 1800.0
BROADCASTS = 20
PARTS = ("jacobian", "assembly", "collective", "solve", "trial", "total")


def _parts(report: dict[str, Any]) -> dict[str, float]:
    return {
        "jacobian": report["seconds_jacobian"] + report["seconds_transfer"],
        "assembly": report["seconds_assembly"],
        "collective": report["seconds_collective"],
        "solve": report["seconds_solve"],
        "trial": report["seconds_trial"],
        "total": report["seconds_total"],
        "attempts": float(report["attempts"]),
    }


def worker(
    rank: int, world: int, store: str, layers: list[int], n: int, threads: str = "one"
) -> dict[str, Any] | None:
    """One rank (in a process of its own): warm-up and timed steps; rank 0 returns every
    rank's reports. ``threads``: ``"one"`` (1 thread) or ``"default"`` (nothing set)."""
    import torch.distributed as dist

    from marquardt.solver import LMA

    widths = tuple(layers)
    if threads == "one":
        torch.set_num_threads(1)
    x_all, y_all = sinc()
    x, y = next(c.shuffled_batches(x_all, y_all, n))
    spec = next(s for s in (*SHAPES, *QUICK_SHAPES) if s[0] == widths and s[1] == n)
    warmup, timed = spec[2], spec[3]
    group = None
    if world > 1:
        dist.init_process_group(
            "gloo",
            store=dist.FileStore(store, world),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=TIMEOUT),
        )
        group = "default"
        share = n // world
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
    lma = LMA(
        tanh_mlp(widths),
        ["cpu"],
        residual_fn=lambda a, b: a - b,
        process_group=group,
        attempts=ATTEMPTS.get(widths, 10),
        strategy="accumulate",
    )
    used = torch.get_num_threads()
    steps = []
    for k in range(warmup + timed):
        lma.step(x, y)
        assert lma.report is not None
        if k >= warmup:
            steps.append(_parts(lma.report.as_dict()))
    broadcast = float("nan")
    if world > 1:
        delta = torch.zeros(lma.report.params if lma.report else 1, dtype=torch.float64)
        times = []
        for _ in range(BROADCASTS):
            dist.barrier()
            t = time.perf_counter()
            dist.broadcast(delta, src=0)
            times.append(time.perf_counter() - t)
        broadcast = c.median(times)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, steps)
    else:
        gathered = [steps]
    if world > 1:
        counts: list[Any] = [None] * world
        dist.all_gather_object(counts, used)
        dist.barrier()
        dist.destroy_process_group()
    else:
        counts = [used]
    if rank != 0:
        return None
    strategy = lma.report.strategy if lma.report is not None else ""
    return {
        "ranks": gathered,
        "broadcast_seconds": broadcast,
        "threads": counts,
        "strategy": strategy,
    }


def _run(world: int, widths: tuple[int, ...], n: int, threads: str = "one") -> dict[str, Any]:
    """Start ``world`` worker processes; every rank's step parts, or an error."""
    with tempfile.TemporaryDirectory() as tmp:
        names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
        env = {k: v for k, v in os.environ.items() if k not in names}
        if threads == "one":
            env.update(dict.fromkeys(names, "1"))
        args = [str(Path(tmp) / "store"), list(widths), n, threads]
        procs = [
            _child.start("bench_distributed", "worker", [r, world, *args], env=env)
            for r in range(world)
        ]
        finished = [_child.finish(proc, TIMEOUT) for proc in procs]
    errors = [error for _, error in finished if error]
    if errors or finished[0][0] is None:
        return {"error": "; ".join(errors) or "no output"}
    data: dict[str, Any] = finished[0][0]
    return data


def _summarise(run: dict[str, Any]) -> dict[str, float]:
    """Medians over the timed steps of the slowest rank's parts."""
    per_rank = [
        {part: c.median([s[part] for s in steps]) for part in (*PARTS, "attempts")}
        for steps in run["ranks"]
    ]
    return {part: max(r[part] for r in per_rank) for part in (*PARTS, "attempts")}


def main(quick: bool = False) -> dict[str, Any]:
    shapes = QUICK_SHAPES if quick else SHAPES
    results: dict[str, Any] = {"machine": _machine.describe(), "shapes": {}}
    for widths, n, _, timed in shapes:
        label = f"{c.mlp_name(widths)} N={n}"
        entry: dict[str, Any] = {"widths": widths, "n": n, "params": c.mlp_params(widths)}
        entry["load_before"] = _machine.load_average()
        runs = [(1, "one"), (2, "one")]
        if widths in DEFAULT_THREAD_SHAPES:
            runs.append((2, "default"))
        for world, threads in runs:
            key = str(world) if threads == "one" else f"{world} default threads"
            print(f"{label}: {key} process(es), {timed} timed step(s)", flush=True)
            run = _run(world, widths, n, threads)
            if "error" in run:
                entry[key] = run
                continue
            entry[key] = {
                "parts": _summarise(run),
                "broadcast_seconds": run["broadcast_seconds"],
                "threads": run["threads"],
                "strategy": run.get("strategy", ""),
            }
        entry["load_after"] = _machine.load_average()
        one, two = entry.get("1", {}), entry.get("2", {})
        if "parts" in one and "parts" in two:
            p1, p2 = one["parts"], two["parts"]
            entry["scaling_jacobian"] = p1["jacobian"] / p2["jacobian"]
            entry["scaling_assembly"] = p1["assembly"] / p2["assembly"]
            entry["scaling_step"] = p1["total"] / p2["total"]
            entry["collective_share"] = p2["collective"] / p2["total"]
            entry["root_solve_extra"] = two["broadcast_seconds"] * p2["attempts"]
            default = entry.get("2 default threads", {}).get("parts")
            if default is not None:
                entry["default_jacobian"] = default["jacobian"] / p2["jacobian"]
                entry["default_step"] = default["total"] / p2["total"]
        results["shapes"][label] = entry
    return results


def _ms(value: float | None) -> str:
    return "—" if value is None or value != value else f"{value * 1e3:,.0f} ms"


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The ratios with their targets, for the aggregate table."""
    rows = []
    for label, e in results["shapes"].items():
        what = f"distributed {label} (P={e['params']:,})"
        if "scaling_jacobian" not in e:
            errors = "; ".join(e[w].get("error", "") for w in ("1", "2") if w in e)
            rows.append(row(f"{what}: did not complete", None, None, detail=errors))
            continue
        p1, p2 = e["1"]["parts"], e["2"]["parts"]
        rows.append(
            row(
                f"{what}: Jacobian 1 proc / 2 procs",
                e["scaling_jacobian"],
                TARGET_SCALING,
                op="≥",
                detail=f"{_ms(p1['jacobian'])} → {_ms(p2['jacobian'])}; load "
                f"{e['load_before']:.1f} → {e['load_after']:.1f}",
            )
        )
        rows.append(
            row(
                f"{what}: assembly 1 proc / 2 procs",
                e["scaling_assembly"],
                None,
                detail=f"{_ms(p1['assembly'])} → {_ms(p2['assembly'])} (local JᵀJ, Jᵀr of "
                "the rank's rows and the system from the reduced products)",
            )
        )
        rows.append(
            row(
                f"{what}: step 1 proc / 2 procs",
                e["scaling_step"],
                None,
                detail=f"{_ms(p1['total'])} → {_ms(p2['total'])}",
            )
        )
        for part, key, ratio in (
            ("Jacobian", "jacobian", "default_jacobian"),
            ("step", "total", "default_step"),
        ):
            if ratio not in e:
                continue
            default = e["2 default threads"]
            rows.append(
                row(
                    f"{what}: {part} 2 procs, default threads / OMP_NUM_THREADS=1",
                    e[ratio],
                    TARGET_DEFAULT_THREADS,
                    detail=f"{_ms(p2[key])} → {_ms(default['parts'][key])}; threads per "
                    f"rank {default['threads']} (the rule) against {e['2']['threads']}",
                )
            )
        rows.append(
            row(
                f"{what}: collective share (2 procs)",
                e["collective_share"],
                None,
                detail=f"all-reduce {_ms(p2['collective'])} of {_ms(p2['total'])}; solve "
                f"{_ms(p2['solve'])}; rank-0 solve would add {_ms(e['root_solve_extra'])} "
                "(δ broadcasts)",
            )
        )
    return rows


def section(results: dict[str, Any]) -> str:
    """The RESULTS.md section: the rows, each run's split and how the collective grows."""
    m = results["machine"]
    lines = [
        f"{m['cpu']}, {m['cores']} cores; 1 torch thread per process (`OMP_NUM_THREADS=1`), "
        "and for the first shape also 2 processes with default threads (nothing set: the "
        "thread rule of `marquardt.devices`); float32, "
        '`LMA(..., strategy="accumulate")` on both sides (N ≥ P); medians over the timed '
        "steps of the slower rank. Load: the 1-minute load average before → after each shape is in "
        "the rows.",
        "",
        "| what | value | target | verdict | detail |",
        "|---|---|---|---|---|",
    ]
    for r in rows(results):
        lines.append(f"| {r.what} | {r.shown} | {r.target} | {r.verdict} | {r.detail} |")
    lines += ["", "| shape | processes | " + " | ".join(PARTS) + " | attempts | strategy |"]
    lines.append("|---" * (len(PARTS) + 4) + "|")
    for label, e in results["shapes"].items():
        for world in ("1", "2", "2 default threads"):
            parts = e.get(world, {}).get("parts")
            if parts:
                cells = " | ".join(_ms(parts[k]) for k in PARTS)
                how = e[world].get("strategy", "")
                lines.append(f"| {label} | {world} | {cells} | {parts['attempts']:g} | {how} |")
    lines += [
        "",
        "The all-reduce of accumulate carries P² + P + 2 numbers (JᵀJ, Jᵀr, ‖r‖², N): "
        "its cost grows as P², independent of N, while the products it replaces grow as "
        "N_k·P² per rank and the solve every rank repeats as P³/3 per attempt; so its share "
        "falls as P grows on one machine (P = 769: 2.4 MB; P = 16,897: 1.1 GB in float32). "
        "Between nodes its time is about 2·4P² bytes over the link's bandwidth "
        "(`docs/lm-many-nodes.md`). Rank 0 solving alone and broadcasting δ would add the "
        "broadcasts shown and save nothing: the other ranks wait for the same factorisation.",
    ]
    return "\n".join(lines)


def echo(results: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    for label, e in results["shapes"].items():
        for world in ("1", "2", "2 default threads"):
            parts = e.get(world, {}).get("parts")
            if parts:
                shown = ", ".join(f"{k} {_ms(parts[k])}" for k in PARTS)
                print(f"  {label} {world} proc: {shown}, attempts {parts['attempts']:g}")


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick)
