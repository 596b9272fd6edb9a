"""The report of ``bench_scale.py``: its section of the results (a table of the shapes,
with each side's peak memory: RSS on the CPU, GPU memory on a GPU), the plot of step time
per shape, and what a run prints.
"""

from __future__ import annotations

from typing import Any

import _common as c
import _device
import _versus as v

#: Per device (GPU or not): how peak memory is measured, and its column's heading.
MEMORY = {
    False: ("peak RSS growth of one step in a fresh process per side.", "peak RSS ours / peer"),
    True: (
        "peak GPU memory over building each side and one step, and what ours left.",
        "peak GPU memory ours / peer; left after deleting ours",
    ),
}


def _memory_cell(e: dict[str, Any]) -> str:
    if e.get("memory"):
        return _device.memory_cell(e["memory"])
    rss = e.get("rss") or {}
    return " / ".join(
        "—" if rss.get(k, {}).get("growth_mib") is None else f"{rss[k]['growth_mib']:.0f} MiB"
        for k in ("ours", "peer")
    )


def ms(value: float | None) -> str:
    """A duration: "1.23 s", "45 ms", "4.4 ms" below 10 ms (a GPU's steps), "—" for none."""
    if value is None:
        return "—"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1e3:.1f} ms" if value < 0.01 else f"{value * 1e3:.0f} ms"


def mib(run: dict[str, Any]) -> str:
    g = run.get("growth_mib")
    return "failed" if g is None else f"{g:.0f} MiB"


@c.plot
def plot(plt: Any, results: dict[str, Any]) -> Any:
    shapes = {k: e for k, e in results["shapes"].items() if "error" not in e}
    if not shapes:
        return None
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
    return fig


def echo(results: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    print(results["problem"])
    print(f"  ours: {results['ours_config']}; peer: {results['peer_config']}")
    for name, e in results["shapes"].items():
        if "error" in e:
            print(f"  {name}: failed: {e['error']}")
            continue
        om = e["ours"]["median"]
        parts = ", ".join(f"{k} {ms(om[k])}" for k in v.PARTS if k in om)
        f = e["floor"]
        kernels = ", ".join(
            f"{k} {ms(s)} ({f['gram_timed_calls'][k]} timed)" for k, s in f["gram_seconds"].items()
        )
        print(
            f"  {name} (P={e['params']:,}, {e['system']}; {e['warmup']} warm-up + "
            f"{len(e['ours']['steps'])} timed steps; load {e['load_before']:.1f} → "
            f"{e['load_after']:.1f}): ours {e['ours_runs']}; parts {parts}"
        )
        print(
            f"    floor: {f['product']} kernels {kernels}; float64 Cholesky "
            f"{ms(f['cholesky_float64_seconds'])} ({f['cholesky_timed_calls']} timed)"
        )


def section(sc: dict[str, Any]) -> str:
    """The shapes as a table; on a GPU, the largest N and the host synchronisations after it."""
    t = c.seconds_text
    gpu = sc.get("device", "cpu").startswith("cuda")
    out = [
        f"{sc['problem']}. Ours: {sc['ours_config']}; peer: {sc['peer_config']}. "
        "Steps interleaved, medians after one warm-up step; floor on a random J of the "
        "same shape; " + MEMORY[gpu][0],
        "",
        "| MLP | P | N | system | ours | peer | floor (kernel + float64 Cholesky) | "
        "ours: jacobian / assembly / solve / trial | attempts ours / peer | "
        f"{MEMORY[gpu][1]} | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in sc["shapes"].values():
        name = c.mlp_name(e["widths"]) + (" (largest)" if e.get("largest") else "")
        if "error" in e:
            out.append(f"| {name} | {e['params']:,} | {e['n']:,} | failed: {e['error']} |")
            continue
        om, pm, f = e["ours"]["median"], e["peer"]["median"], e["floor"]
        best = f["gram_best_kernel"]
        mem = _memory_cell(e)
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
    if "largest" in sc:
        big = sc["largest"]
        note = big.get("note") or big.get("error", "")
        out += ["", f"Largest N for P = {big['params']:,}: {big['n']:,} {note}".rstrip()]
    if "syncs" in sc:
        out += ["", "Host synchronisations in one step (after a warm-up step):", ""]
        out += _device.sync_lines(sc["syncs"])
    return "\n".join(out)
