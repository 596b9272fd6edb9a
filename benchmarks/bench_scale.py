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
growth of the peak over it during the step (CPU only; ``bench_gpu.py`` measures GPU memory).

Targets: ours ≤ 0.67× the peer's median step; ours ≤ 1.5× the floor; our peak RSS growth
≤ the peer's.

Parameter subsets (``_scale_subsets.py``): the 1-512-512-512-1 MLP (P = 526,849) at
N = 10000 with k = 4096 parameters per step, ours by layer and at random against the peer's
random selection, each for the same wall time, and Adam at its best learning rate; time per
step, peak RSS and the MSE on the full data after the budget (about 6 minutes in all).
``--subsets-only`` runs that part alone (``results/scale-subsets.json``). ``python benchmarks/bench_scale.py [--quick] [--device cpu]``; ``main()``
writes ``results/scale.json`` and ``results/scale.png`` (``scale-quick.*`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import _common as c
import _registry as registry
import _scale_subsets as subsets
import _versus as v
import torch

# (widths, N, timed steps)
SHAPES: tuple[tuple[tuple[int, ...], int, int], ...] = (
    ((1, 64, 64, 1), 20_000, 5),
    ((1, 128, 128, 1), 2_000, 7),
    ((1, 128, 128, 128, 128, 1), 2_000, 5),
)
# Development only: the same code paths (one over-, one under-determined) in seconds.
QUICK_SHAPES: tuple[tuple[tuple[int, ...], int, int], ...] = (
    ((1, 16, 16, 1), 2_000, 3),
    ((1, 32, 32, 1), 300, 3),
)
CAP_SECONDS = 150.0
FLOOR_REPEATS = 3
FLOOR_BUDGET = 4.0
RSS_TIMEOUT = 300.0
TARGET_PEER = 0.67
TARGET_FLOOR = 1.5
TARGET_RSS = 1.0


def rss_child(kind: str, widths: Sequence[int], n: int) -> dict[str, Any]:
    """One LM step of ``kind`` ("ours" or "peer") in this fresh process; its peak RSS growth."""
    c.setup_threads()
    device = torch.device("cpu")
    ((x, y),) = v.batches(n, 1, device)
    step = (v.make_ours if kind == "ours" else v.make_peer)(widths, device)[0]
    return {"kind": kind, **c.step_rss(lambda: step(x, y))}


def _rss(widths: Sequence[int], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("ours", "peer"):
        spec = json.dumps({"kind": kind, "widths": list(widths), "n": n})
        result, error = c.run_child([__file__, "--child-rss", spec], RSS_TIMEOUT)
        out[kind] = result if result is not None else {"kind": kind, "error": error}
    return out


def measure_shape(
    widths: Sequence[int], n: int, steps: int, device: torch.device, *, rss: bool
) -> dict[str, Any]:
    """Interleaved steps of ours and the peer, the floor, and (CPU) each side's peak RSS."""
    load_before = c.load_average()
    entry = v.measure_shape(
        widths,
        n,
        device,
        steps=steps,
        cap=CAP_SECONDS,
        floor_repeats=FLOOR_REPEATS,
        floor_budget=FLOOR_BUDGET,
    )
    if "error" in entry["floor"]:
        raise RuntimeError(f"the floor failed: {entry['floor']['error']}")
    entry["load_before"] = load_before
    entry["rss"] = _rss(widths, n) if rss else {}
    entry["load_after"] = c.load_average()
    ours = entry["ours"]["median"].get("step")
    peer = entry["peer"]["median"].get("step")
    floor = entry["floor"]["floor_seconds"]
    growth = {k: entry["rss"].get(k, {}).get("growth_mib") for k in ("ours", "peer")}
    entry["ratios"] = {
        "ours_vs_peer": None if ours is None or peer is None else ours / peer,
        "ours_vs_floor": None if ours is None else ours / floor,
        "rss_ours_vs_peer": None
        if growth["ours"] is None or growth["peer"] is None
        else growth["ours"] / max(growth["peer"], 1.0),
    }
    return entry


def main(quick: bool = False, device: str = "cpu", *, with_subsets: bool = True) -> dict[str, Any]:
    c.setup_threads()
    where = torch.device(device)
    shapes = QUICK_SHAPES if quick else SHAPES
    results: dict[str, Any] = {
        "problem": f"sinc(10x), shuffled batches of N from the seed's {c.DATASET_SIZE} "
        f"points, tanh MLPs, float32, {c.THREADS} threads, device {where}",
        "quick": quick,
        "device": str(where),
        "ours_config": "LMA defaults (Nielsen damping, Marquardt scaling, strategy and "
        "backend auto), step(x, y) without slice_size",
        "peer_config": "LevenbergMarquardtModule(solve_method='cholesky'), defaults otherwise",
        "targets": {
            "ours_vs_peer": TARGET_PEER,
            "ours_vs_floor": TARGET_FLOOR,
            "rss_ours_vs_peer": TARGET_RSS,
        },
        "load_average": {"before": c.load_average()},
        "shapes": {},
    }
    for widths, n, steps in shapes:
        name = f"{c.mlp_name(widths)} N={n}"
        try:
            results["shapes"][name] = measure_shape(
                widths, n, steps, where, rss=where.type == "cpu"
            )
        except Exception as exc:  # one shape's failure is a result; the others still run
            results["shapes"][name] = {
                "widths": list(widths),
                "params": c.mlp_params(widths),
                "n": n,
                "error": v.describe_error(exc),
            }
            v.release(where)
    if with_subsets and not quick and where.type == "cpu":
        results["subsets"] = subsets.measure(__file__)
    results["load_average"]["after"] = c.load_average()
    c.write_json("scale-quick" if quick else "scale", results)
    _plot(results, "scale-quick.png" if quick else "scale.png")
    return results


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.0f} ms"


def _mib(run: dict[str, Any]) -> str:
    g = run.get("growth_mib")
    return "failed" if g is None else f"{g:.0f} MiB"


def summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The ratios with their targets, for the aggregate table."""
    rows = []
    for e in results["shapes"].values():
        label = f"scale {c.mlp_name(e['widths'])} (P={e['params']:,}) N={e['n']:,}"
        if "error" in e:
            rows.append(c.row(f"{label}: did not complete", None, None, detail=e["error"]))
            continue
        ours, peer, floor = e["ours"], e["peer"], e["floor"]
        om, pm = ours["median"], peer["median"]
        errors = "; ".join(
            f"{k} failed: {e[k]['error']}" for k in ("ours", "peer") if e[k]["error"]
        )
        rows.append(
            c.row(
                f"{label}: ours / peer",
                e["ratios"]["ours_vs_peer"],
                TARGET_PEER,
                detail=f"ours {_ms(om.get('step'))}, peer {_ms(pm.get('step'))} (medians of "
                f"{len(ours['steps'])} / {len(peer['steps'])} steps; attempts "
                f"{om.get('attempts', float('nan')):g} / {pm.get('attempts', float('nan')):g})"
                + (f"; {errors}" if errors else ""),
            )
        )
        best = floor["gram_best_kernel"]
        rows.append(
            c.row(
                f"{label}: ours / floor",
                e["ratios"]["ours_vs_floor"],
                TARGET_FLOOR,
                detail=f"floor {_ms(floor['floor_seconds'])} = {floor['product']} by {best} "
                f"{_ms(floor['gram_seconds'][best])} + float64 Cholesky "
                f"({floor['system_size']:,}²) {_ms(floor['cholesky_float64_seconds'])}",
            )
        )
        if e.get("rss"):
            rows.append(
                c.row(
                    f"{label}: peak RSS ours / peer",
                    e["ratios"]["rss_ours_vs_peer"],
                    TARGET_RSS,
                    detail=f"ours {_mib(e['rss']['ours'])}, peer {_mib(e['rss']['peer'])} "
                    "(growth of one step, fresh process each)",
                )
            )
    if "subsets" in results:
        rows.extend(subsets.summary(results["subsets"]))
    return rows


def _plot(results: dict[str, Any], png: str) -> None:
    plt = c.pyplot()
    if plt is None:
        return
    shapes = {k: e for k, e in results["shapes"].items() if "error" not in e}
    if not shapes:
        return
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.27
    for offset, (key, label, color) in enumerate(
        (
            ("ours", "marquardt LMA", "#4c72b0"),
            ("peer", "torch-levenberg-marquardt", "#dd8452"),
            ("floor", "floor: Gram + float64 Cholesky", "#999999"),
        )
    ):
        values = []
        for e in shapes.values():
            if key == "floor":
                values.append(e["floor"]["floor_seconds"])
            else:
                values.append(e[key]["median"].get("step", float("nan")))
        xs = [i + (offset - 1) * width for i in range(len(shapes))]
        ax.bar(xs, values, width, label=label, color=color)
    ax.set_xticks(
        range(len(shapes)),
        [f"{c.mlp_name(e['widths'])}\nP={e['params']:,} N={e['n']:,}" for e in shapes.values()],
        fontsize=8,
    )
    ax.set_yscale("log")
    ax.set_ylabel("seconds per LM step (median)")
    ax.set_title(results["problem"], fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    c.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    fig.savefig(c.RESULTS_DIR / png, dpi=120)
    plt.close(fig)


def _print(results: dict[str, Any]) -> None:
    print(results["problem"])
    print(f"  ours: {results['ours_config']}; peer: {results['peer_config']}")
    for name, e in results["shapes"].items():
        if "error" in e:
            print(f"  {name}: failed: {e['error']}")
            continue
        om = e["ours"]["median"]
        parts = ", ".join(f"{k} {_ms(om[k])}" for k in v.PARTS if k in om)
        f = e["floor"]
        kernels = ", ".join(
            f"{k} {_ms(s)} ({f['gram_timed_calls'][k]} timed)" for k, s in f["gram_seconds"].items()
        )
        print(
            f"  {name} (P={e['params']:,}, {e['system']}; {e['warmup']} warm-up + "
            f"{len(e['ours']['steps'])} timed steps; load {e['load_before']:.1f} → "
            f"{e['load_after']:.1f}): ours {e['ours_runs']}; parts {parts}"
        )
        print(
            f"    floor: {f['product']} kernels {kernels}; float64 Cholesky "
            f"{_ms(f['cholesky_float64_seconds'])} ({f['cholesky_timed_calls']} timed)"
        )
    print(c.format_rows(summary(results)))


def _cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (development)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu)")
    parser.add_argument("--subsets-only", action="store_true", help="the P = 526,849 part alone")
    parser.add_argument("--child-rss", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-subsets", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_subsets:
        print(subsets.child(args.child_subsets))
        return 0
    if args.subsets_only:
        part = {"machine": c.machine(), "subsets": subsets.measure(__file__)}
        c.write_json("scale-subsets", part)
        print(
            json.dumps({k: v for k, v in part["subsets"].items() if k != "rss"}, default=str)[:3000]
        )
        print(c.format_rows(subsets.summary(part["subsets"])))
        return 0
    if args.child_rss:
        spec = json.loads(args.child_rss)
        print(json.dumps(rss_child(spec["kind"], spec["widths"], spec["n"])))
        return 0
    _print(main(quick=args.quick, device=args.device))
    return 0


def section(sc: dict[str, Any]) -> str:
    t = c.seconds_text

    out = [
        f"{sc['problem']}. Ours: {sc['ours_config']}; peer: {sc['peer_config']}. "
        "Steps interleaved, medians after one warm-up step; floor on a random J of the "
        "same shape; peak RSS growth of one step in a fresh process per side.",
        "",
        "| MLP | P | N | system | ours | peer | floor (kernel + float64 Cholesky) | "
        "ours: jacobian / assembly / solve / trial | attempts ours / peer | "
        "peak RSS ours / peer | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in sc["shapes"].values():
        name = "-".join(str(w) for w in e["widths"])
        if "error" in e:
            out.append(f"| {name} | {e['params']:,} | {e['n']:,} | failed: {e['error']} |")
            continue
        om, pm, f = e["ours"]["median"], e["peer"]["median"], e["floor"]
        best = f["gram_best_kernel"]
        rss = e.get("rss") or {}
        mem = " / ".join(
            "—" if rss.get(k, {}).get("growth_mib") is None else f"{rss[k]['growth_mib']:.0f} MiB"
            for k in ("ours", "peer")
        )
        parts = " / ".join(t(om.get(k)) for k in ("jacobian", "assembly", "solve", "trial"))
        out.append(
            f"| {name} | {e['params']:,} | {e['n']:,} | {e['system']} | "
            f"{t(om.get('step'))} ({len(e['ours']['steps'])} steps) | "
            f"{t(pm.get('step'))} ({len(e['peer']['steps'])} steps) | "
            f"{t(f['floor_seconds'])} ({best} {t(f['gram_seconds'][best])} + "
            f"{t(f['cholesky_float64_seconds'])}) | {parts} | "
            f"{om.get('attempts', float('nan')):g} / {pm.get('attempts', float('nan')):g} | "
            f"{mem} | {e['load_before']:.1f} → {e['load_after']:.1f} |"
        )
    return "\n".join(out)


def _rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """``summary``, with the subsets part from ``results/scale-subsets.json`` when a full
    run on the CPU lacks it (``--subsets-only`` was run alone after it)."""
    full_cpu = not results.get("quick") and results.get("device", "cpu") == "cpu"
    if "subsets" not in results and full_cpu:
        path = c.RESULTS_DIR / "scale-subsets.json"
        part = json.loads(path.read_text()) if path.exists() else {}
        if "subsets" in part:
            results = {**results, "subsets": part["subsets"]}
    return summary(results)


def _run(quick: bool, device: str, budget: float | None) -> dict[str, Any]:
    return main(quick=quick, device=device)


BENCHMARK = registry.Benchmark(
    name="scale",
    title="LM at the scale users bring",
    question="Does the step hold at P = 4k–50k, and what do parameter subsets give at P = 527k?",
    peer="torch-levenberg-marquardt; the floor; Adam for subsets",
    target="≤ 0.67× the peer, ≤ 1.5× the floor, peak RSS ≤ the peer's",
    run=_run,
    rows=_rows,
    section=section,
    devices=("cpu", "cuda"),
    png="scale.png",
    echo=_print,
)


if __name__ == "__main__":
    sys.exit(_cli())
