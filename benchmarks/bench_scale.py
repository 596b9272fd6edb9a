"""LM at the scale users bring: deeper and wider tanh MLPs than the tutorial's, on the CPU.

Problem: ``y = sinc(10 x)`` (the seed's 100000 points, shuffled batches of N), float32,
``torch.set_num_threads(2)``, one process; for each shape both optimizers start from the
same parameters and get the same batches, their steps interleaved (``_versus.py``):

* 1-64-64-1 (P = 4,353) at N = 20000: over-determined, the P × P system;
* 1-128-128-1 (P = 16,897) at N = 2000: under-determined, the N × N system;
* 1-128-128-128-128-1 (P = 49,921) at N = 2000: under-determined, J of 400 MB.

Ours is ``LMA(model, [device], a - b)`` with its defaults and ``step(x, y)`` without a
``slice_size`` — what a user writes first; the Jacobian engine then cuts the batch into
chunks within its own memory budget (cuPyLMA's users pass slices of 1000-5000 samples
because cuPyLMA needs them; ours does not). The peer is
``LevenbergMarquardtModule(model, solve_method="cholesky")``, as in ``bench_step.py``.
Steps: 1 warm-up and then 5 timed steps of each at N = 20000 and at P = 49,921, 7 at
P = 16,897 (and no new step after ``CAP_SECONDS`` of a shape). The tutorial's shape (1-256-1,
P = 769, N = 10000) is ``bench_step.py``'s, not repeated here.

The floor, measured in the same run (``_floor.py``): the fastest of torch ``mm``, NumPy's
``syrk``, SciPy's ``ssyrk`` and torch's MKL ``ssyrk`` forming ``JᵀJ`` (N > P) or ``JJᵀ``
(N < P) of a random float32 J of that shape, plus one float64 Cholesky solve of the
P × P or N × N system; each kernel is timed up to ``FLOOR_REPEATS`` times within
``FLOOR_BUDGET`` seconds, after one untimed call.

Peak memory: each side's one LM step in a fresh process, as ``bench_memory.py`` measures
it — data, model and optimizer built, the peak-RSS mark reset to the current RSS, then the
growth of the peak over it during the step. On a GPU (``--device cuda``, ``PLANS``): also
the tutorial's shape, larger N and the largest N whose whole J the planner fits, with each
side's peak GPU memory and what ours leaves after its deletion (``_device.py``), and the
host synchronisations in one step.

Targets: ours ≤ 0.67× the peer's median step; ours ≤ 1.5× the floor; our peak RSS growth
≤ the peer's.

Parameter subsets (``_scale_subsets.py``): the 1-512-512-512-1 MLP (P = 526,849) at
N = 10000 with k = 4096 parameters per step, ours by layer and at random against the peer's
random selection, each for the same wall time, and Adam at its best learning rate; time per
step, peak RSS and the MSE on the full data after the budget (about 6 minutes in all).
``python benchmarks/_child.py _scale_subsets main`` runs that part alone
(``results/scale-subsets.json``). ``python benchmarks/run_all.py scale [--quick]
[--device cuda]``; ``main()`` writes ``results/scale.json`` and ``results/scale.png``
(``scale-quick.*`` with ``--quick``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import _child
import _common as c
import _device
import _machine
import _scale_report as report
import _scale_subsets as subsets
import _versus as v
import torch
from _registry import Options
from _rows import Row, row
from _scale_report import mib, ms

#: Stands for "the largest N whose whole J the planner fits on the device" in a shape list.
LARGEST = 0
RSS_TIMEOUT = 300.0
TARGET_FLOOR = 1.5
TARGET_RSS = 1.0
#: Seconds of a GPU run's shapes when ``--budget`` does not say.
GPU_BUDGET = 450.0


@dataclass(frozen=True)
class Plan:
    """What a run measures on one kind of device.

    **Arguments:**

    - `shapes`: (widths, N, timed steps) each; N = ``LARGEST`` for the largest N that fits.
    - `cap`, `largest_cap`: seconds per shape (and for the largest one) at most.
    - `min_seconds`: a shape with less of the budget left is skipped.
    - `floor_repeats`, `floor_budget`: the floor's timed calls and their seconds (None: a
      sixth of what is left of the shape's cap).
    - `target_peer`: the target of ours / the peer.
    - `clip`: the largest N at most (None: the planner's).
    """

    shapes: tuple[tuple[tuple[int, ...], int, int], ...]
    cap: float
    largest_cap: float
    min_seconds: float
    floor_repeats: int
    floor_budget: float | None
    target_peer: float
    clip: int | None = None


#: (device type, quick) -> the plan. On the CPU: the shapes users bring beyond the
#: tutorial's (``bench_step.py``'s); on a GPU also the tutorial's, larger N and the largest.
PLANS: dict[tuple[str, bool], Plan] = {
    ("cpu", False): Plan(
        (((1, 64, 64, 1), 20_000, 5), ((1, 128, 128, 1), 2_000, 7), ((1, 128, 128, 128, 128, 1), 2_000, 5)),
        cap=150.0, largest_cap=150.0, min_seconds=0.0, floor_repeats=3, floor_budget=4.0,
        target_peer=0.67,
    ),
    # Development only: the same code paths (one over-, one under-determined) in seconds.
    ("cpu", True): Plan(
        (((1, 16, 16, 1), 2_000, 3), ((1, 32, 32, 1), 300, 3)),
        cap=150.0, largest_cap=150.0, min_seconds=0.0, floor_repeats=3, floor_budget=4.0,
        target_peer=0.67,
    ),
    ("cuda", False): Plan(
        (
            ((1, 256, 1), 10_000, 15), ((1, 256, 1), 100_000, 15),
            ((1, 128, 128, 1), 2_000, 15), ((1, 128, 128, 1), 20_000, 15),
            ((1, 128, 128, 128, 128, 1), 2_000, 15), ((1, 128, 128, 128, 128, 1), 10_000, 15),
            ((1, 128, 128, 128, 128, 1), LARGEST, 15),
        ),
        cap=30.0, largest_cap=150.0, min_seconds=15.0, floor_repeats=5, floor_budget=None,
        target_peer=0.5,
    ),
    ("cuda", True): Plan(
        (
            ((1, 16, 1), 2_000, 15), ((1, 16, 1), 5_000, 15), ((1, 24, 24, 1), 300, 15),
            ((1, 24, 24, 1), 1_000, 15), ((1, 24, 24, 1), LARGEST, 15),
        ),
        cap=6.0, largest_cap=6.0, min_seconds=2.0, floor_repeats=5, floor_budget=None,
        target_peer=0.5, clip=1_500,
    ),
}  # fmt: skip


def rss_child(kind: str, widths: Sequence[int], n: int) -> dict[str, Any]:
    """One LM step of ``kind`` ("ours" or "peer") in this fresh process; its peak RSS growth."""
    c.setup_threads()
    device = torch.device("cpu")
    ((x, y),) = v.batches(n, 1, device)
    step = (v.make_ours if kind == "ours" else v.make_peer)(widths, device)[0]
    return {"kind": kind, **_machine.step_rss(lambda: step(x, y))}


def _rss(widths: Sequence[int], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("ours", "peer"):
        args = [kind, list(widths), n]
        result, error = _child.call("bench_scale", "rss_child", args, timeout=RSS_TIMEOUT)
        out[kind] = result if result is not None else {"kind": kind, "error": error}
    return out


def measure_shape(
    widths: Sequence[int], n: int, steps: int, device: torch.device, plan: Plan, cap: float
) -> dict[str, Any]:
    """Interleaved steps of ours and the peer, the floor, and each side's peak memory
    (RSS in a fresh process on the CPU; GPU memory over building it and one step)."""
    load_before = _machine.load_average()
    gpu = device.type == "cuda"
    entry = v.measure_shape(
        widths,
        n,
        device,
        steps=steps,
        cap=cap,
        floor_repeats=plan.floor_repeats,
        floor_budget=plan.floor_budget,
        step_share=0.6 if gpu else 1.0,
        memory=_device.gpu_memory if gpu else None,
    )
    if "error" in entry["floor"] and not gpu:
        raise RuntimeError(f"the floor failed: {entry['floor']['error']}")
    entry["load_before"] = load_before
    entry["rss"] = {} if gpu else _rss(widths, n)
    entry["load_after"] = _machine.load_average()
    ours = entry["ours"]["median"].get("step")
    peer = entry["peer"]["median"].get("step")
    floor = entry["floor"].get("floor_seconds")
    growth = {k: entry["rss"].get(k, {}).get("growth_mib") for k in ("ours", "peer")}
    entry["ratios"] = {
        "ours_vs_peer": None if ours is None or peer is None else ours / peer,
        "ours_vs_floor": None if ours is None or floor is None else ours / floor,
        "rss_ours_vs_peer": None
        if growth["ours"] is None or growth["peer"] is None
        else growth["ours"] / max(growth["peer"], 1.0),
    }
    return entry


def _largest(plan: Plan, device: torch.device) -> dict[str, Any]:
    """The largest N of the plan's largest network that the planner fits on ``device``."""
    big = max((c.mlp_params(w) for w, n, _ in plan.shapes if n == LARGEST), default=0)
    if not big:
        return {}
    try:
        n, lines, note = _device.largest_batch(big, device, plan.clip)
        return {"params": big, "n": n, "plan": lines, "note": note}
    except Exception as exc:  # a failure is a result; the other shapes still run
        return {"params": big, "n": 0, "error": v.describe_error(exc)}


def main(
    quick: bool = False,
    device: str = "cpu",
    *,
    budget: float | None = None,
    with_subsets: bool = True,
) -> dict[str, Any]:
    """Every shape of the device's plan (``PLANS``), within ``budget`` seconds (GPU: its
    own budget); on a GPU first the largest N and the host synchronisations."""
    where = torch.device(device)
    gpu = where.type == "cuda"
    plan = PLANS[(where.type, quick)]
    if not gpu:
        c.setup_threads()
    end = time.monotonic() + (budget or (GPU_BUDGET if gpu else float("inf")))
    results: dict[str, Any] = {
        "problem": f"sinc(10x), shuffled batches of N from the seed's {c.DATASET_SIZE} "
        f"points, tanh MLPs, float32, "
        + (f"device {where}" if gpu else f"{c.THREADS} threads, device {where}"),
        "quick": quick,
        "device": str(where),
        "ours_config": "LMA defaults (Nielsen damping, Marquardt scaling, strategy and "
        "backend auto), step(x, y) without slice_size",
        "peer_config": "LevenbergMarquardtModule(solve_method='cholesky'), defaults otherwise",
        "targets": {
            "ours_vs_peer": plan.target_peer,
            "ours_vs_floor": TARGET_FLOOR,
            "rss_ours_vs_peer": TARGET_RSS,
        },
        "load_average": {"before": _machine.load_average()},
        "shapes": {},
    }
    largest = _largest(plan, where)
    if largest:
        results["largest"] = largest
    if gpu:
        _device.warm(where)
        results["syncs"] = _device.count_syncs(where)
    for widths, n, steps in plan.shapes:
        is_largest = n == LARGEST
        n = largest.get("n", 0) if is_largest else n
        name = f"{c.mlp_name(widths)} N={n if n else 'largest'}"
        left = end - time.monotonic()
        cap = min(plan.largest_cap if is_largest else plan.cap, left - 5.0)
        if not n or cap < plan.min_seconds:
            results["shapes"][name] = {
                "widths": list(widths),
                "params": c.mlp_params(widths),
                "n": n,
                "largest": is_largest,
                "error": f"skipped: {left:.0f} s of the budget left"
                if n
                else largest.get("error", "no N fits on the device"),
            }
            continue
        try:
            entry = measure_shape(widths, n, steps, where, plan, cap)
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
    if with_subsets and not quick and not gpu:
        results["subsets"] = subsets.measure()
    results["load_average"]["after"] = _machine.load_average()
    report.plot(results, f"scale{c.suffix(quick, device)}.png")
    return results


def _details(e: dict[str, Any]) -> dict[str, str]:
    """The figures behind each ratio of shape ``e``: the steps, the floor, the peak RSS."""
    ours, peer, floor, rss = e["ours"], e["peer"], e["floor"], e.get("rss")
    om, pm = ours["median"], peer["median"]
    errors = "; ".join(f"{k} failed: {e[k]['error']}" for k in ("ours", "peer") if e[k]["error"])
    out = {
        "ours_vs_peer": f"ours {ms(om.get('step'))}, peer {ms(pm.get('step'))} (medians of "
        f"{len(ours['steps'])} / {len(peer['steps'])} steps; attempts "
        f"{om.get('attempts', float('nan')):g} / {pm.get('attempts', float('nan')):g})"
        + (f"; {errors}" if errors else ""),
        "ours_vs_floor": floor.get("error", ""),
    }
    if "error" not in floor:
        best = floor["gram_best_kernel"]
        out["ours_vs_floor"] = (
            f"floor {ms(floor['floor_seconds'])} = {floor['product']} by {best} "
            f"{ms(floor['gram_seconds'][best])} + float64 Cholesky "
            f"({floor['system_size']:,}²) {ms(floor['cholesky_float64_seconds'])}"
        )
    if rss:
        out["rss_ours_vs_peer"] = (
            f"ours {mib(rss['ours'])}, peer {mib(rss['peer'])} "
            "(growth of one step, fresh process each)"
        )
    return out


#: Each ratio of a shape: its key in the results, its name in the rows.
RATIOS = {
    "ours_vs_peer": "ours / peer",
    "ours_vs_floor": "ours / floor",
    "rss_ours_vs_peer": "peak RSS ours / peer",
}


def _shape_rows(results: dict[str, Any]) -> list[Row]:
    """Per shape: ours / the peer, ours / the floor, and each side's peak memory."""
    targets = results["targets"]
    rows = []
    for e in results["shapes"].values():
        largest = " (largest)" if e.get("largest") else ""
        label = f"scale {c.mlp_name(e['widths'])} (P={e['params']:,}) N={e['n']:,}{largest}"
        if "error" in e:
            rows.append(row(f"{label}: did not complete", None, None, detail=e["error"]))
            continue
        for key, detail in _details(e).items():
            value = e["ratios"][key]
            rows.append(row(f"{label}: {RATIOS[key]}", value, targets[key], detail=detail))
        if e.get("memory"):
            rows.extend(_device.memory_rows(label, e["memory"]))
    if "subsets" in results:
        rows.extend(subsets.summary(results["subsets"]))
    return [*_device.sync_rows(results.get("syncs", {})), *rows]


def rows(results: dict[str, Any]) -> list[Row]:
    """The ratios with their targets, with the subsets part from
    ``results/scale-subsets.json`` when a full run on the CPU lacks it (that part was run
    alone after it)."""
    full_cpu = not results.get("quick") and results.get("device", "cpu") == "cpu"
    if "subsets" not in results and full_cpu:
        path = c.RESULTS_DIR / "scale-subsets.json"
        part = json.loads(path.read_text()) if path.exists() else {}
        if "subsets" in part:
            alone = {r.what for r in subsets.summary(part["subsets"])}
            out = _shape_rows({**results, "subsets": part["subsets"]})
            return [replace(r, source="scale-subsets") if r.what in alone else r for r in out]
    return _shape_rows(results)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick, device=o.device, budget=o.budget)


#: Its section of the report, and what a run prints (``_scale_report.py``).
section = report.section
echo = report.echo
