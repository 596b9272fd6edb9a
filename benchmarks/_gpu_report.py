"""The report of ``bench_gpu.py``: ratios with targets, the JSON, the plot and RESULTS-gpu.md."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import _common as c
import _registry as registry
import bench_curve_fit

MIB = 2**20
TARGET_PEER = 0.5
TARGET_FLOOR = 1.5
TARGET_QUALITY = 0.5
TARGET_MEMORY = 1.0
QUALITY_THRESHOLD = "1e-06"


def duration(value: float | None) -> str:
    if value is None or value != value:
        return "—"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1e3:.1f} ms" if value < 0.01 else f"{value * 1e3:.0f} ms"


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / MIB:,.0f} MiB"


def _label(e: dict[str, Any]) -> str:
    largest = " (largest)" if e.get("largest") else ""
    return f"{c.mlp_name(e['widths'])} (P={e['params']:,}) N={e['n']:,}{largest}"


def _bounded(o: float | None, p: float | None, o_run: dict[str, Any], p_run: dict[str, Any]):
    """The ratio of two times to a goal, or a bound when one side did not reach it."""
    if o is not None and p is not None:
        return o / p, ""
    if o is not None:  # the peer did not get there: its time exceeds its run
        return o / max(p_run.get("train_seconds", 0.0), 1e-9), "<"
    if p is not None:
        return o_run.get("train_seconds", 0.0) / p, ">"
    return None, ""


def shape_rows(e: dict[str, Any]) -> list[dict[str, Any]]:
    label = f"gpu {_label(e)}"
    if "error" in e and "ours" not in e:
        return [c.row(f"{label}: not measured", None, None, detail=e["error"])]
    om, pm = e["ours"]["median"], e["peer"]["median"]
    ours, peer = om.get("step"), pm.get("step")
    errors = "; ".join(f"{k}: {e[k]['error']}" for k in ("ours", "peer") if e[k]["error"])
    rows = [
        c.row(
            f"{label}: ours / peer",
            None if ours is None or peer is None else ours / peer,
            TARGET_PEER,
            detail=f"ours {duration(ours)}, peer {duration(peer)} ({len(e['ours']['steps'])} / "
            f"{len(e['peer']['steps'])} steps; attempts {om.get('attempts', float('nan')):g} / "
            f"{pm.get('attempts', float('nan')):g})" + (f"; {errors}" if errors else ""),
        )
    ]
    f = e.get("floor", {})
    if "error" in f:
        rows.append(c.row(f"{label}: ours / floor", None, TARGET_FLOOR, detail=f["error"]))
    else:
        best = f["gram_best_kernel"]
        rows.append(
            c.row(
                f"{label}: ours / floor",
                None if ours is None else ours / f["floor_seconds"],
                TARGET_FLOOR,
                detail=f"floor {duration(f['floor_seconds'])} = {f['product']} by {best} "
                f"{duration(f['gram_seconds'][best])} + float64 Cholesky ({f['system_size']:,}²) "
                f"{duration(f['cholesky_float64_seconds'])}",
            )
        )
    memory = e.get("memory")
    if memory:
        mo, mp = memory["ours"], memory["peer"]
        ratio = (
            None
            if mo["peak_bytes"] is None or mp["peak_bytes"] is None
            else mo["peak_bytes"] / max(mp["peak_bytes"], 1)
        )
        rows.append(
            c.row(
                f"{label}: peak GPU memory ours / peer",
                ratio,
                TARGET_MEMORY,
                detail=f"ours {_mib(mo['peak_bytes'])}{' ' + mo['error'] if mo['error'] else ''}, "
                f"peer {_mib(mp['peak_bytes'])}{' ' + mp['error'] if mp['error'] else ''} "
                "(build + one step, over the memory allocated before)",
            )
        )
        rows.append(
            c.row(
                f"{label}: GPU memory left after deleting ours",
                mo["leftover_bytes"] / MIB,
                0.0,
                unit=" MiB",
                detail=f"{mo['leftover_bytes']:,} bytes over the baseline of "
                f"{_mib(mo['base_bytes'])} (peer: {mp['leftover_bytes']:,} bytes)",
            )
        )
    return rows


def summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ratio with its target."""
    rows: list[dict[str, Any]] = []
    q = results.get("quality", {})
    if "ours" in q and "peer" in q:
        o_run, p_run = q["ours"], q["peer"]
        if "error" in o_run or "error" in p_run:
            detail = "; ".join(r["error"] for r in (o_run, p_run) if "error" in r)
            rows.append(
                c.row("gpu time to MSE 1e-6 (1-64-1): ours / peer", None, None, detail=detail)
            )
        else:
            o = o_run["reached"].get(QUALITY_THRESHOLD)
            p = p_run["reached"].get(QUALITY_THRESHOLD)
            value, bound = _bounded(o, p, o_run, p_run)
            rows.append(
                c.row(
                    "gpu time to MSE 1e-6 (1-64-1, batch 10000): ours / peer",
                    value,
                    TARGET_QUALITY,
                    bound=bound,
                    detail=f"ours {_reached(o_run)}, peer {_reached(p_run)}",
                )
            )
    syncs = results.get("syncs", {})
    if "ours" in syncs:
        peer = syncs.get("peer", {}).get("count")
        rows.append(
            c.row(
                "gpu host synchronisations in one step of ours (1-64-1)",
                syncs["ours"].get("count"),
                None,
                unit="",
                detail=f"peer {peer if peer is not None else '—'}; "
                + (syncs["ours"].get("error") or "sites in the JSON"),
            )
        )
    fits = results.get("curve_fit", {})
    if "error" in fits:
        rows.append(c.row("gpu curve_fit: did not complete", None, None, detail=fits["error"]))
    elif fits.get("sizes"):
        rows.extend(bench_curve_fit.summary(fits, prefix="gpu "))
    for e in results.get("shapes", {}).values():
        rows.extend(shape_rows(e))
    for key, part in results.get("newer", {}).items():
        rows.extend(_newer_rows(key, part))
    return rows


def _record(part: dict[str, Any]) -> registry.Benchmark:
    """The registered benchmark that measured a newer part (by module in older results)."""
    if "benchmark" in part:
        return registry.get(part["benchmark"])
    return registry.get(next(n for n, m in registry.MODULES.items() if m == part["module"]))


def _newer_rows(key: str, part: dict[str, Any]) -> list[dict[str, Any]]:
    """A newer benchmark's own rows, each named as measured on this device."""
    if "results" not in part:
        why = part.get("error") or part.get("absent", "not run")
        return [c.row(f"gpu {key}: not measured", None, None, detail=why)]
    rows = []
    for r in _record(part).rows(part["results"]):
        rows.append({**r, "what": f"gpu {r['what']}"})
    return rows


def _newer_text(results: dict[str, Any]) -> list[str]:
    """One section per newer benchmark, in that benchmark's own words."""
    out: list[str] = []
    for key, part in results.get("newer", {}).items():
        out += ["", f"## {key} (`{part.get('module', key)}.py`)", ""]
        if "results" in part:
            out.append(_record(part).section(part["results"]))
        else:
            out.append(f"Not measured: {part.get('error') or part.get('absent', 'not run')}")
    return out


def _reached(run: dict[str, Any]) -> str:
    t = run["reached"].get(QUALITY_THRESHOLD)
    if t is not None:
        return f"{t:.2f} s ({run['steps']} steps)"
    return f"not reached in {run['train_seconds']:.0f} s ({run['steps']} steps, final MSE {run['final_mse']:.2e})"


# -- files ---------------------------------------------------------------------------------
def paths(out: Path, md: Path | None, *, quick: bool) -> dict[str, Path]:
    """Where a run writes its JSON and plot (``out``) and its report (``md``, default
    ``benchmarks/RESULTS-gpu.md``); ``-quick`` in each name for a quick run."""
    suffix = "-quick" if quick else ""
    return {
        "json": out / f"gpu{suffix}.json",
        "png": out / f"gpu{suffix}.png",
        "md": md or c.HERE / f"RESULTS-gpu{suffix}.md",
    }


def write(results: dict[str, Any], paths: dict[str, Path]) -> None:
    """The JSON, the plot and the Markdown report (each folder created as needed)."""
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    paths["json"].write_text(json.dumps(results, indent=2, default=c.jsonable) + "\n")
    plotted = _plot(results, paths["png"])
    paths["md"].write_text(markdown(results, paths["png"] if plotted else None, paths["md"]))


def _plot(results: dict[str, Any], png: Path) -> bool:
    plt = c.pyplot()
    shapes = [e for e in results.get("shapes", {}).values() if "ours" in e]
    if plt is None or not shapes:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label, marker, color in (
        ("ours", "marquardt LMA", "o", "#4c72b0"),
        ("peer", "torch-levenberg-marquardt", "s", "#dd8452"),
        ("floor", "floor: Gram + float64 Cholesky", "^", "#777777"),
    ):
        points = []
        for e in shapes:
            if key == "floor":
                value = e.get("floor", {}).get("floor_seconds")
            else:
                value = e[key]["median"].get("step")
            if value is not None:
                points.append((e["params"], value, e["n"]))
        if points:
            ax.scatter([p for p, _, _ in points], [s for _, s, _ in points], marker=marker,
                       color=color, label=label, zorder=3)  # fmt: skip
            if key == "ours":
                for p, s, n in points:
                    ax.annotate(f"N={n:,}", (p, s), textcoords="offset points", xytext=(5, 3),
                                fontsize=6)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("P (parameters)")
    ax.set_ylabel("seconds per LM step (median)")
    m = results["machine"]
    ax.set_title(f"sinc tanh MLPs, float32, {m.get('gpu', m['device'])}", fontsize=9)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return True


def _step_cell(e: dict[str, Any], side: str) -> str:
    median = e[side]["median"]
    if e[side]["error"] and not median:
        return f"failed: {e[side]['error']}"
    return f"{duration(median.get('step'))} ({len(e[side]['steps'])})"


def _shape_table(results: dict[str, Any]) -> list[str]:
    out = [
        "| MLP | P | N | system | ours | peer | floor (kernel + float64 Cholesky) | "
        "ours: jacobian / assembly / solve / trial | attempts ours / peer | "
        "peak GPU memory ours / peer | left after delete (ours) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in results.get("shapes", {}).values():
        name = c.mlp_name(e["widths"]) + (" (largest)" if e.get("largest") else "")
        if "ours" not in e:
            out.append(f"| {name} | {e['params']:,} | {e['n']:,} | {e.get('error', '')} |")
            continue
        om, pm, f = e["ours"]["median"], e["peer"]["median"], e.get("floor", {})

        if "error" in f:
            floor = f"failed: {f['error']}"
        else:
            best = f["gram_best_kernel"]
            floor = (
                f"{duration(f['floor_seconds'])} ({best} {duration(f['gram_seconds'][best])} + "
                f"{duration(f['cholesky_float64_seconds'])})"
            )
        parts = " / ".join(duration(om.get(k)) for k in ("jacobian", "assembly", "solve", "trial"))
        memory = e.get("memory") or {}
        peaks = " / ".join(
            (f"failed ({memory[k]['error'][:60]})" if memory[k]["error"] else _mib(memory[k]["peak_bytes"]))
            for k in ("ours", "peer")
        ) if memory else "—"  # fmt: skip
        left = f"{memory['ours']['leftover_bytes']:,} B" if memory else "—"
        out.append(
            f"| {name} | {e['params']:,} | {e['n']:,} | {e['system']} | {_step_cell(e, 'ours')} | "
            f"{_step_cell(e, 'peer')} | {floor} | {parts} | {om.get('attempts', float('nan')):g} / "
            f"{pm.get('attempts', float('nan')):g} | {peaks} | {left} |"
        )
    return out


def _quality_table(results: dict[str, Any]) -> list[str]:
    q = results.get("quality", {})
    if not q:
        return ["Not measured."]
    thresholds = ("0.001", "0.0001", "1e-05", "1e-06")
    out = [
        "| optimizer | steps | "
        + " | ".join(f"MSE {t}" for t in thresholds)
        + " | final MSE | stopped |",
        "|---|---|" + "---|" * len(thresholds) + "---|---|",
    ]
    for key, label in (
        ("ours", "marquardt LMA (slice 5000)"),
        ("peer", "torch-levenberg-marquardt"),
    ):
        run = q.get(key, {})
        if "error" in run or not run:
            out.append(f"| {label} | failed: {run.get('error', 'not run')} |")
            continue
        cells = [
            duration(run["reached"].get(t)) if run["reached"].get(t) is not None
            else f"not in {run['train_seconds']:.0f} s"
            for t in thresholds
        ]  # fmt: skip
        out.append(
            f"| {label} | {run['steps']} | " + " | ".join(cells)
            + f" | {run['final_mse']:.2e} | {run['stopped']} |"
        )  # fmt: skip
    return out


def _sync_lines(results: dict[str, Any]) -> list[str]:
    s = results.get("syncs", {})
    if "note" in s:
        return [s["note"] + "."]
    out = []
    for key in ("ours", "peer"):
        r = s.get(key, {})
        if r.get("count") is None:
            out.append(f"- {key}: failed: {r.get('error', 'not run')}")
            continue
        sites = ", ".join(f"`{k}` ×{n}" for k, n in r.get("sites", {}).items())
        out.append(f"- {key}: {r['count']} ({sites or 'none'})")
    return out


def _curve_fit_text(results: dict[str, Any]) -> str:
    fits = results.get("curve_fit", {})
    if "error" in fits:
        return f"Did not complete: {fits['error']}"
    return bench_curve_fit.section(fits) if fits.get("sizes") else "Not measured."


def section(results: dict[str, Any]) -> str:
    """The step times, with where the whole report is: ``Benchmark.section`` of ``gpu``."""
    m = results["machine"]
    return "\n".join(
        [
            f"{m.get('gpu', m['device'])} ({m['device']}), {m['date_utc']} (UTC), "
            f"{m['source']}; the whole report: [RESULTS-gpu.md](RESULTS-gpu.md).",
            "",
            *_shape_table(results),
        ]
    )


def markdown(results: dict[str, Any], png: Path | None, md: Path) -> str:
    m = results["machine"]
    largest = results.get("largest", {})
    lines = [
        "# GPU benchmark results",
        "",
        "Generated by `benchmarks/bench_gpu.py` (see `benchmarks/gpu/README.md`); do not edit "
        "by hand."
        + (" **Quick run (tiny shapes, development only).**" if results["quick"] else ""),
        "",
        "## Machine",
        "",
        f"- Device: {m.get('gpu', m['device'])} ({m['device']})"
        + (
            f", {m['multiprocessors']} multiprocessors, {m['gpu_memory_gib']} GiB; NVIDIA driver "
            f"{m['driver']}"
            if "gpu" in m
            else ""
        ),
        f"- torch {m['torch']}, CUDA {m['cuda']}, cuDNN {m['cudnn']}; TF32 matmul "
        f"{'on' if m['tf32_matmul'] else 'off'} (float32 matmul precision "
        f"{m['float32_matmul_precision']}); Python {m['python']}; CPU {m['cpu']}, "
        f"{m['torch_threads']} torch threads",
        f"- torch-levenberg-marquardt {m['torch_levenberg_marquardt']}; CuPy {m['cupy']}",
        f"- Date: {m['date_utc']} (UTC); source measured: {m['source']}",
        f"- Run: {results.get('seconds', 0):.0f} s of a {results['budget_seconds']:.0f} s budget",
        "",
        "## Every ratio against its target",
        "",
        "| ratio | measured | target | verdict | figures |",
        "|---|---|---|---|---|",
    ]
    for r in summary(results):
        verdict = {"PASS": "PASS", "MISS": "**MISS**"}.get(r["verdict"], r["verdict"])
        lines.append(f"| {r['what']} | {r['shown']} | {r['target']} | {verdict} | {r['detail']} |")
    lines += [
        "",
        "## Step time",
        "",
        f"Ours: {results['ours_config']}. Peer: {results['peer_config']}. Steps interleaved on "
        "the same batches, medians after a warm-up (count in brackets); peak GPU memory of "
        "building each optimizer and one step, measured apart; floor on a random J of the "
        "same shape.",
        "",
        *_shape_table(results),
    ]
    if png is not None:
        lines += ["", f"![step time against P]({os.path.relpath(png, md.parent)})"]
    lines += [
        "",
        f"Largest N for P = {largest.get('params', 0):,}: {largest.get('n', 0):,}"
        + (f" ({largest['note']})" if largest.get("note") else "")
        + (f" — {largest['error']}" if largest.get("error") else "")
        + ". The planner's arithmetic at that N (`marquardt.devices.plan(P, N, "
        'strategy="explicit")`):',
        "",
        *(f"    {line}" for line in largest.get("plan", [])),
        "",
        "## Time to quality (the seed's sinc loop, 1-64-1, batches of 10000)",
        "",
        *_quality_table(results),
        "",
        "Training wall time (batch transfer and step; the clock stops for the evaluations on "
        "all 100000 points).",
        "",
        "## curve_fit against SciPy (`bench_curve_fit.py`'s problem; SciPy on the host)",
        "",
        _curve_fit_text(results),
        "",
        "## Host synchronisations in one LM step",
        "",
        'Counted with `torch.cuda.set_sync_debug_mode("warn")` over one step after a '
        "warm-up step, on the loop above:",
        "",
        *_sync_lines(results),
        *_newer_text(results),
        "",
    ]
    return "\n".join(lines)
