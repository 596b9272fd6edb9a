"""Run every benchmark, print every ratio beside its target, and write ``RESULTS.md``.

``nox -s bench`` runs ``python benchmarks/run_all.py``. Each benchmark runs in its own
process (so that one cannot leave memory, threads or cached kernel choices to the next)
and writes ``results/<name>.json`` and a PNG plot; this script collects their ratios,
prints them with the target and PASS / MISS ("open" when one side did not reach a goal
within its time cap and the bound does not decide; "info" for figures without a target),
and regenerates ``benchmarks/RESULTS.md`` with the figures, the plots and the machine they
came from (CPU, cores, torch / NumPy versions and BLAS, and the load average during each
benchmark, since the figures mean little on a loaded machine).

Options: ``--only step,quality`` (or the names alone: ``nox -s bench -- scale``; ``pinn``
stands for both PINN benchmarks, ``pinn`` and ``pinn_suite``) runs a subset (RESULTS.md
keeps every other benchmark's latest figures: its section and its rows of verdicts are
rebuilt from its last ``results/<name>.json``); ``--quick`` uses small
sizes and short caps (development only; it does not rewrite RESULTS.md);
``--wait-idle SECONDS`` waits up to that long for the 1-minute load average to drop below
``IDLE_LOAD`` before starting.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

# (name, module, keyword arguments for main(); quick keyword arguments)
BENCHMARKS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("jacobian", "bench_jacobian", {}, {"repeats": 3}),
    ("backends", "bench_backends", {}, {}),
    ("step", "bench_step", {}, {"steps": 4}),
    ("scale", "bench_scale", {}, {"quick": True}),
    ("strategy", "bench_strategy", {}, {}),
    ("distributed", "bench_distributed", {}, {"quick": True}),
    ("memory", "bench_memory", {}, {"sizes": (10_000, 100_000)}),
    ("curve_fit", "bench_curve_fit", {}, {"quick": True}),
    ("small_fit", "bench_small_fit", {}, {"quick": True}),
    ("batch_fit", "bench_batch_fit", {}, {"quick": True}),
    ("nist", "bench_nist", {}, {"quick": True}),
    ("pinn", "bench_pinn", {}, {"quick": True}),
    (
        "matrix_free",
        "bench_matrix_free",
        {},
        {"budget_seconds": 8.0, "dense_seconds": 8.0, "sinc_seconds": 20.0, "medium": False},
    ),
    (
        "pinn_suite",
        "bench_pinn_suite",
        {},
        {"budget": 5.0, "problems": ("heat", "poisson"), "quick": True},
    ),
    (
        "quality",
        "bench_quality",
        {},
        {"cap": 8.0, "adam_cap": 5.0, "adam_cap_max": 5.0, "tune": 1.0, "hidden_sizes": (64,)},
    ),
]
NAMES = [b[0] for b in BENCHMARKS]
#: Names that stand for several benchmarks (``nox -s bench -- pinn``: both PINN benchmarks).
GROUPS = {"pinn": ["pinn", "pinn_suite"]}
IDLE_LOAD = 1.5
TIMEOUT = 1500.0
RESULTS_MD = c.HERE / "RESULTS.md"
SUMMARY_JSON = c.RESULTS_DIR / "summary.json"
MARKER = "@@ROWS@@ "


# -- the rows of the other benchmarks (their own scripts print their own tables) ----------
def _jacobian_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    s, ratios, target = r["seconds"], r["ratios"], r.get("target_ratio", 1.0)
    mem = r.get("accumulate_peak_rss_growth_mib_slice_5000", {})
    mem_text = ", ".join(f"{k}: {v:.0f} MiB" for k, v in mem.items() if v is not None)
    return [
        c.row(
            "jacobian: explicit J / peer J (N=10000)",
            ratios["explicit_vs_peer_jacobian"],
            target,
            detail=f"ours {s['ours_explicit'] * 1e3:.0f} ms, peer "
            f"{s['peer_jacobian'] * 1e3:.0f} ms",
        ),
        c.row(
            "jacobian: accumulate / peer J",
            ratios["accumulate_vs_peer_jacobian"],
            target,
            detail=f"ours {s['ours_accumulate'] * 1e3:.0f} ms (J, JᵀJ, Jᵀr)",
        ),
        c.row(
            "jacobian: accumulate / peer J+JᵀJ+Jᵀr",
            ratios["accumulate_vs_peer_jacobian_and_products"],
            None,
            detail=f"peer {s['peer_jacobian_and_products'] * 1e3:.0f} ms; accumulate peak "
            f"growth {mem_text}",
        ),
    ]


def _backends_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for run in r.get("runs", []):
        if run.get("legate_cpus", 0) == 0 and run.get("torch_threads") != c.THREADS:
            continue
        where = (
            f"Legate {run['legate_cpus']} CPU"
            if run.get("legate_cpus")
            else f"{run['torch_threads']} threads"
        )
        rows.append(
            c.row(
                f"backends: {run['backend']} {run['strategy']} ({where}) / best",
                run.get("ratio_to_best_non_legate"),
                None,
                detail=f"step {run['median_step_s'] * 1e3:.0f} ms (min {run['min_step_s'] * 1e3:.0f})",
            )
        )
    return rows


def rows_for(name: str, results: dict[str, Any]) -> list[dict[str, Any]]:
    if name == "jacobian":
        return _jacobian_rows(results)
    if name == "backends":
        return _backends_rows(results)
    module = __import__(dict((b[0], b[1]) for b in BENCHMARKS)[name])
    return list(module.summary(results))


# -- one benchmark in a child process ------------------------------------------------------
def child(name: str, quick: bool) -> None:
    """Inside the child: run the benchmark, print its own report, then the rows as JSON."""
    spec = {b[0]: b for b in BENCHMARKS}[name]
    module = __import__(spec[1])
    results = module.main(**(spec[3] if quick else spec[2]))
    if hasattr(module, "_print"):
        module._print(results)
    rows = rows_for(name, results)
    sys.stdout.write(MARKER + json.dumps(rows, default=str) + "\n")


def run_one(name: str, quick: bool) -> dict[str, Any]:
    """Run one benchmark in a fresh process, streaming its output; its rows and timing."""
    load_before = c.load_average()
    start = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name]
    if quick:
        command.append("--quick")
    rows: list[dict[str, Any]] = []
    tail: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(MARKER):
                rows = json.loads(line[len(MARKER) :])
                continue
            print(f"    | {line.rstrip()}", flush=True)
            tail = ([*tail, line.rstrip()])[-5:]
        try:
            code = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -9
    seconds = time.perf_counter() - start
    error = "" if code == 0 and rows else f"exit code {code}: " + " | ".join(tail[-3:])
    if error:
        rows = [c.row(f"{name}: did not complete", None, None, detail=error)]
    return {
        "name": name,
        "seconds": seconds,
        "load_before": load_before,
        "load_after": c.load_average(),
        "rows": rows,
        "error": error,
    }


def wait_for_idle(limit: float) -> float:
    """Wait (up to ``limit`` seconds) for the 1-minute load average to drop below IDLE_LOAD."""
    deadline = time.monotonic() + limit
    load = c.load_average()
    while load >= IDLE_LOAD and time.monotonic() < deadline:
        print(
            f"load average {load:.2f} ≥ {IDLE_LOAD}: waiting for the machine to settle", flush=True
        )
        time.sleep(min(60.0, max(1.0, deadline - time.monotonic())))
        load = c.load_average()
    return load


# -- RESULTS.md ----------------------------------------------------------------------------
def _load_json(name: str) -> dict[str, Any] | None:
    path = c.RESULTS_DIR / f"{name}.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| ratio | measured | target | verdict | figures |", "|---|---|---|---|---|"]
    for r in rows:
        verdict = {"PASS": "PASS", "MISS": "**MISS**"}.get(r["verdict"], r["verdict"])
        lines.append(f"| {r['what']} | {r['shown']} | {r['target']} | {verdict} | {r['detail']} |")
    return "\n".join(lines)


def _fmt_s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def _quality_section(q: dict[str, Any]) -> str:
    thresholds = [f"{t:g}" for t in q["thresholds"]]
    out = [
        "| model | optimizer | steps | "
        + " | ".join(f"MSE {t}" for t in thresholds)
        + " | final MSE | stopped |",
        "|---|---|---|" + "---|" * len(thresholds) + "---|---|",
    ]
    for _name, entry in q["models"].items():
        for key, label in (
            ("ours", "marquardt LMA"),
            ("peer", "torch-levenberg-marquardt"),
            ("adam", f"Adam (lr {entry['adam_lr']:g})"),
        ):
            run = entry[key]
            cells = [
                _fmt_s(run["reached"].get(t))
                if run["reached"].get(t) is not None
                else f"not in {run['train_seconds']:.0f} s"
                for t in thresholds
            ]
            final = "—" if run.get("final_mse") is None else f"{run['final_mse']:.2e}"
            out.append(
                f"| 1-{entry['ours']['hidden']}-1 | {label} | {run['steps']} | "
                + " | ".join(cells)
                + f" | {final} | {run['stopped']} |"
            )
    tuning = "; ".join(
        f"{name}: "
        + ", ".join(
            f"lr {k} → {v['final_mse']:.2e}"
            for k, v in e["adam_tuning"].items()
            if v["final_mse"] is not None
        )
        for name, e in q["models"].items()
    )
    caps = q["caps_seconds"]
    return (
        "\n".join(out)
        + f"\n\nCaps: {caps['lm']:g} s of training per LM run; for Adam {caps['adam']:g} s, or "
        f"10.5× our time to 1e-4 when that is longer (at most {caps.get('adam_max', caps['adam']):g} "
        f"s), after a {caps['adam_tuning']:g} s trial of each learning rate (lowest full-dataset MSE wins): "
        f"{tuning}. Times exclude the full-dataset MSE evaluations (the clock stops for them)."
    )


def _memory_section(m: dict[str, Any]) -> str:
    sizes = m["sizes"]
    out = [
        "| strategy | " + " | ".join(f"N={n:,}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    kinds: list[str] = []
    for run in m["runs"].values():
        if run["kind"] not in kinds:
            kinds.append(run["kind"])
    for kind in kinds:
        cells = []
        for n in sizes:
            run = m["runs"].get(f"{kind} N={n}", {})
            g = run.get("growth_mib")
            cells.append(
                "failed" if g is None else f"{g:.0f} MiB ({run.get('step_seconds', 0):.1f} s)"
            )
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    out.append(
        "| J alone (N×P float32) | "
        + " | ".join(f"{n * 769 * 4 / 2**20:.0f} MiB" for n in sizes)
        + " |"
    )
    return "\n".join(out) + (
        "\n\nPeak RSS growth of one LM step over the RSS after data, model "
        "and optimizer were built (fresh process each; step time beside)."
    )


def _strategy_section(s: dict[str, Any]) -> str:
    out = []
    for name, entry in s["shapes"].items():
        out.append(
            f"**{name}** — rows {entry['rows']}, P {entry['params']}, m "
            f"{entry['outputs_per_sample']}; planner: `{entry['planner_choice']}` "
            f"({entry['planner_reason']})\n"
        )
        out.append("| strategy/mode | seconds | peak growth |\n|---|---|---|")
        for k, v in entry["combinations"].items():
            mark = " ← planner" if k == entry["planner_choice"] else ""
            mem = "—" if v["peak_growth_mib"] is None else f"{v['peak_growth_mib']:.0f} MiB"
            proj = " (projected)" if v["projected"] else ""
            out.append(f"| {k}{mark} | {v['seconds']:.3f}{proj} | {mem} |")
        out.append("")
    return "\n".join(out)


def _step_section(st: dict[str, Any]) -> str:
    s = st["seconds"]
    parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in s["ours_parts_median"].items())
    gram = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in st["floor"]["gram_seconds"].items())
    return (
        f"{st['problem']}; {st['steps']} steps each, interleaved, medians.\n\n"
        f"- ours: {s['ours_step_median'] * 1e3:.0f} ms per step ({st['ours_config']}); "
        f"median parts from `lma.report`: {parts}; median attempts "
        f"{st['attempts_median']['ours']:g}\n"
        f"- peer: {s['peer_step_median'] * 1e3:.0f} ms per step ({st['peer_config']}); its "
        f"`_compute_jacobian` {s['peer_compute_jacobian_median'] * 1e3:.0f} ms, JᵀJ as a full "
        f"GEMM {s['peer_jtj_full_gemm_median'] * 1e3:.0f} ms; median attempts "
        f"{st['attempts_median']['peer']:g}\n"
        f"- floor: {st['floor']['floor_seconds'] * 1e3:.0f} ms = fastest JᵀJ kernel "
        f"({gram}) + float64 P×P Cholesky solve "
        f"{st['floor']['cholesky_float64_seconds'] * 1e3:.1f} ms"
    )


def _scale_section(sc: dict[str, Any]) -> str:
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


def _backends_section(b: dict[str, Any]) -> str:
    out = [
        "| backend | strategy | Legate CPUs | torch threads | step (median) | min | "
        "jacobian | assembly | solve |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in b.get("runs", []):
        p = r["median_parts_s"]
        out.append(
            f"| {r['backend']} | {r['strategy']} | {r['legate_cpus']} | "
            f"{r['torch_threads']} | {r['median_step_s'] * 1e3:.0f} ms | "
            f"{r['min_step_s'] * 1e3:.0f} ms | {p['jacobian'] * 1e3:.0f} ms | "
            f"{p['assembly'] * 1e3:.0f} ms | {p['solve'] * 1e3:.0f} ms |"
        )
    return "\n".join(out)


def _jacobian_section(j: dict[str, Any]) -> str:
    s = j["seconds"]
    lines = [f"{j['problem']}, {j['repeats']} repeats, medians."]
    for k, v in s.items():
        lines.append(f"- {k}: {v * 1e3:.0f} ms")
    lines.append(f"- plan: {j.get('accumulate_plan', '')}")
    return "\n".join(lines)


SECTIONS = {
    "step": ("LM step time", "step.png", _step_section, "bench_step.py"),
    "scale": ("LM at the scale users bring", "scale.png", _scale_section, "bench_scale.py"),
    "quality": ("Time to quality", "quality.png", _quality_section, "bench_quality.py"),
    "memory": ("Memory of one LM step", "memory.png", _memory_section, "bench_memory.py"),
    "strategy": ("Planner choices", "strategy.png", _strategy_section, "bench_strategy.py"),
    "matrix_free": (
        "Matrix-free LM where JᵀJ does not fit",
        None,
        lambda r: __import__("bench_matrix_free").section(r),
        "bench_matrix_free.py",
    ),
    "jacobian": ("Jacobian", None, _jacobian_section, "bench_jacobian.py"),
    "backends": ("Array backends", None, _backends_section, "bench_backends.py"),
    "distributed": (
        "LM across processes",
        None,
        lambda d: __import__("bench_distributed").section(d),
        "bench_distributed.py",
    ),
    "curve_fit": (
        "curve_fit against SciPy",
        None,
        lambda r: __import__("bench_curve_fit").section(r),
        "bench_curve_fit.py",
    ),
    "small_fit": (
        "Single small fits against SciPy",
        None,
        lambda r: __import__("bench_small_fit").section(r),
        "bench_small_fit.py",
    ),
    "batch_fit": (
        "Many small fits at once: curve_fit_batch",
        None,
        lambda r: __import__("bench_batch_fit").section(r),
        "bench_batch_fit.py",
    ),
    "nist": (
        "NIST StRD nonlinear regression, both starts",
        None,
        lambda r: __import__("bench_nist").section(r),
        "bench_nist.py",
    ),
    "pinn": (
        "PINN: 2-D Poisson",
        None,
        lambda r: __import__("bench_pinn").section(r),
        "bench_pinn.py",
    ),
    "pinn_suite": (
        "PINN problem suite: LM against Adam, L-BFGS and Adam then L-BFGS",
        None,
        lambda r: __import__("bench_pinn_suite").section(r),
        "bench_pinn_suite.py",
    ),
}


def _latest(name: str) -> dict[str, Any] | None:
    """A benchmark's latest results; the scale benchmark's subsets part, when last run
    alone (``bench_scale.py --subsets-only``), from ``results/scale-subsets.json``."""
    data = _load_json(name)
    if name == "scale" and data is not None and "subsets" not in data:
        part = _load_json("scale-subsets")
        if part is not None and "subsets" in part:
            data = {**data, "subsets": part["subsets"]}
    return data


def kept_runs(names: list[str]) -> list[dict[str, Any]]:
    """The runs of benchmarks not run this time, with rows rebuilt from each one's latest
    ``results/<name>.json``: a benchmark last run alone (its own script, or run_all with a
    subset) keeps its figures and verdicts, not those of the last full run."""
    try:
        previous = {r["name"]: r for r in json.loads(SUMMARY_JSON.read_text()).get("runs", [])}
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        previous = {}
    kept = []
    for name in names:
        run = dict(previous.get(name, {"name": name, "seconds": 0.0, "error": ""}))
        run.setdefault("load_before", None)
        run.setdefault("load_after", None)
        data = _latest(name)
        if data is not None:
            try:
                run["rows"] = rows_for(name, data)
            except (KeyError, TypeError, ValueError, ImportError) as exc:
                run.setdefault(
                    "rows", [c.row(f"{name}: results unreadable", None, None, detail=repr(exc))]
                )
        if run.get("rows"):
            kept.append(run)
    return kept


def _load_text(run: dict[str, Any]) -> str:
    if run.get("load_before") is None:
        return f"{run['name']} (figures from its own last run)"
    return (
        f"{run['name']} {run['load_before']:.1f} → {run['load_after']:.1f} ({run['seconds']:.0f} s)"
    )


def write_results_md(summary: dict[str, Any]) -> None:
    m = summary["machine"]
    runs = summary["runs"]
    lines = [
        "# Benchmark results",
        "",
        "Generated by `nox -s bench` (`benchmarks/run_all.py`); do not edit by hand — the "
        "analysis of the misses lives in `benchmarks/NOTES.md` and is included below.",
        "",
        f"Last run: {summary['finished']} (UTC), {summary['total_seconds'] / 60:.1f} min in "
        f"all{' for the benchmarks run then' if summary.get('partial') else ''}.",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu']} ({m['cpu_flags']}), {m['cores']} cores, {m['memory_gib']} GiB; "
        f"{m['threads_used']} torch threads",
        f"- Python {m['python']} on {m['platform']}",
        f"- Source measured: {m.get('source', 'unknown')}",
        f"- torch {m['torch']} (BLAS: {m['torch_blas']}); NumPy {m['numpy']} "
        f"(BLAS: {m['numpy_blas']}); torch-levenberg-marquardt {m['torch_levenberg_marquardt']}",
        "- Load: the cores are shared. 1-minute load average before → after each benchmark: "
        + "; ".join(_load_text(r) for r in runs)
        + ". A load above 2 means other processes took CPU time from the measurement; "
        "figures taken then are pessimistic for both sides, and ratios are less reliable.",
        "",
        "## Every ratio against its target",
        "",
        _table([row for r in runs for row in r["rows"]]),
        "",
        "`open`: one side did not reach the goal within its time cap and the bound does not "
        "decide the target; `info`: no target.",
        "",
    ]
    for name in NAMES:
        data = _load_json(name)
        title, png, render, script = SECTIONS[name]
        lines += [f"## {title} (`{script}`)", ""]
        if data is None:
            lines += ["No results yet.", ""]
            continue
        try:
            lines.append(render(data))
        except (KeyError, TypeError, ValueError) as exc:
            lines.append(f"(results/{name}.json has an unexpected layout: {exc!r})")
        if png and (c.RESULTS_DIR / png).exists():
            lines += ["", f"![{title}](results/{png})"]
        lines.append("")
    notes = c.HERE / "NOTES.md"
    if notes.exists():
        lines += [
            "## Analysis (hand-written, `benchmarks/NOTES.md`)",
            "",
            notes.read_text().strip(),
            "",
        ]
    RESULTS_MD.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"benchmarks to run (all by default), as with --only: {NAMES}"
    )
    parser.add_argument("--only", default="", help=f"comma-separated subset of {NAMES}")
    parser.add_argument("--quick", action="store_true", help="small sizes (development)")
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.quick)
        return 0
    asked = [n for n in [*args.names, *args.only.split(",")] if n]
    names = list(dict.fromkeys(m for n in asked for m in GROUPS.get(n, [n]))) or NAMES
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; the known ones are {NAMES}")
    if args.wait_idle > 0:
        wait_for_idle(args.wait_idle)
    start = time.perf_counter()
    machine = c.machine()
    print(
        f"machine: {machine['cpu']}, {machine['cores']} cores; torch {machine['torch']} "
        f"({machine['torch_blas']}); numpy {machine['numpy']} ({machine['numpy_blas']}); "
        f"load {machine['load_average_1min']:.2f}",
        flush=True,
    )
    runs = []
    for name in names:
        print(f"\n== {name} ==", flush=True)
        run = run_one(name, args.quick)
        print(f"== {name}: {run['seconds']:.0f} s ==", flush=True)
        print(c.format_rows(run["rows"]), flush=True)
        runs.append(run)
    total = time.perf_counter() - start
    print("\n== every ratio against its target ==")
    print(c.format_rows([row for r in runs for row in r["rows"]]))
    print(f"\ntotal {total / 60:.1f} min; load average now {c.load_average():.2f}")
    if args.quick:
        print("(--quick: RESULTS.md left as it was)")
        return 0
    summary = {
        "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "total_seconds": total,
        "partial": names != NAMES,
        "machine": machine,
        "runs": runs,
    }
    if names != NAMES:  # keep every other benchmark's latest figures
        summary["runs"] = sorted(
            runs + kept_runs([n for n in NAMES if n not in names]),
            key=lambda r: NAMES.index(r["name"]),
        )
    SUMMARY_JSON.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY_JSON.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    write_results_md(summary)
    print(f"wrote {RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
