"""``RESULTS.md`` and ``results/summary.json`` (``RESULTS-gpu.md`` and
``results/summary-gpu.json`` for a GPU's figures): every ratio against its target, then one
section per benchmark, each in its own words (its module's ``section``), and the machine.

The analysis of the misses is hand-written in ``NOTES.md``, which RESULTS.md links.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import _common as c
import _registry as registry
from _rows import Run, row, table
from _stamp import stamp


@dataclass(frozen=True)
class Report:
    """One report and its files: RESULTS.md for the CPU's figures, RESULTS-gpu.md for a
    GPU's, and their quick twins (development runs, never committed).

    **Arguments:**

    - `suffix`: what the report's files add to their names (``_common.suffix``): "",
      "-quick", "-gpu" or "-gpu-quick"; each benchmark's results are
      ``results/<name><suffix>.json``.
    """

    suffix: str = ""

    @property
    def gpu(self) -> bool:
        """Whether it reports a GPU's figures."""
        return self.suffix.startswith("-gpu")

    @property
    def markdown(self) -> Path:
        """``RESULTS<suffix>.md``."""
        return c.HERE / f"RESULTS{self.suffix}.md"

    @property
    def summary_json(self) -> Path:
        """``results/summary<suffix>.json``: the runs' rows and the machine."""
        return c.RESULTS_DIR / f"summary{self.suffix}.json"

    def load(self, name: str) -> dict[str, Any] | None:
        """The latest ``results/<name><suffix>.json``, or None where there is none (or it is
        unreadable)."""
        try:
            text = (c.RESULTS_DIR / f"{name}{self.suffix}.json").read_text()
            data: dict[str, Any] = json.loads(text)
        except (OSError, json.JSONDecodeError):
            return None
        return data

    def shown(self) -> list[str]:
        """The benchmarks it shows. On the CPU: those ``nox -s bench`` runs, and those run
        only when named that run on the CPU and have recorded results; on a GPU: those that
        run there and have recorded results."""
        if self.gpu:
            return [n for n in registry.MODULES if "cuda" in registry.get(n).devices]
        every = registry.defaults()
        named = [n for n in registry.MODULES if n not in every]
        return every + [n for n in named if "cpu" in registry.get(n).devices and self.load(n)]

    def png(self, name: str) -> str | None:
        """The file name of benchmark ``name``'s plot in this report."""
        png = registry.get(name).png
        return None if png is None else png.removesuffix(".png") + f"{self.suffix}.png"


#: The report of the recorded CPU figures.
CPU = Report()


@dataclass
class Summary:
    """A run of ``run_all.py``: when it finished, how long it took, where, and its runs.

    **Arguments:**

    - `finished`: when it finished (UTC, "YYYY-MM-DD HH:MM").
    - `total_seconds`: its wall time.
    - `machine`: ``_machine.describe()``'s description.
    - `runs`: the runs, in order.
    - `partial`: whether it ran a part of the default benchmarks only.
    """

    finished: str
    total_seconds: float
    machine: dict[str, Any]
    runs: list[Run]
    partial: bool = False

    def record(self) -> dict[str, Any]:
        """The summary as a plain object, for ``summary.json``."""
        return {
            "finished": self.finished,
            "total_seconds": self.total_seconds,
            "machine": self.machine,
            "runs": [r.record() for r in self.runs],
            "partial": self.partial,
        }

    @classmethod
    def load(cls, record: dict[str, Any]) -> Summary:
        """A summary from ``record`` (``record``'s form)."""
        return cls(
            finished=record["finished"],
            total_seconds=record["total_seconds"],
            machine=record["machine"],
            runs=[Run.load(r) for r in record.get("runs", [])],
            partial=record.get("partial", False),
        )


def kept_runs(names: list[str], report: Report, previous: list[Run] | None = None) -> list[Run]:
    """The runs of benchmarks not run this time, with rows rebuilt from each one's latest
    results: a benchmark last run alone (run_all with a subset) keeps its figures and
    verdicts, not those of the last full run. ``previous``: the recorded runs (None: read
    from the report's summary JSON)."""
    if previous is None:
        try:
            previous = Summary.load(json.loads(report.summary_json.read_text())).runs
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            previous = []
    by_name = {r.name: r for r in previous}
    kept = []
    for name in names:
        run = by_name.get(name, Run(name))
        data = report.load(name)
        if data is not None:
            try:
                run.rows = registry.get(name).rows(data)
            except (KeyError, TypeError, ValueError, ImportError) as exc:
                if not run.rows:
                    run.rows = [row(f"{name}: results unreadable", None, None, detail=repr(exc))]
        if run.rows:
            kept.append(run)
    return kept


def rebuilt(summary: Summary, report: Report) -> Summary:
    """``summary`` with every run's rows rebuilt from its benchmark's recorded results, so
    that the report says what the data say (a run whose results are missing or unreadable
    keeps its recorded rows, and a run that did not complete its failure): what
    ``run_all.py --render`` writes and ``--check`` asks for."""
    copies = [replace(r) for r in summary.runs if not r.error]
    fresh = {r.name: r for r in kept_runs([r.name for r in copies], report, copies)}
    return replace(summary, runs=[fresh.get(r.name, r) for r in summary.runs])


def complete(runs: list[Run], report: Report) -> list[Run]:
    """``runs`` and the kept runs of every other benchmark shown, in the registry's order."""
    done = {r.name for r in runs}
    kept = kept_runs([n for n in report.shown() if n not in done], report)
    order = list(registry.MODULES)
    return sorted(runs + kept, key=lambda r: order.index(r.name))


def record(summary: Summary, report: Report) -> None:
    """Write the report's summary JSON and Markdown for a run of some or all benchmarks;
    every other benchmark shown keeps its latest figures."""
    asked = registry.defaults() if not report.gpu else report.shown()
    summary.partial = [r.name for r in summary.runs] != asked
    summary.runs = complete(summary.runs, report)
    report.summary_json.parent.mkdir(parents=True, exist_ok=True)
    report.summary_json.write_text(json.dumps(summary.record(), indent=2, default=str) + "\n")
    write(summary, report)


def sources(run: Run, report: Report) -> list[str]:
    """The results each of ``run``'s rows comes from (``results/<name><suffix>.json``'s
    name): the row's ``source`` where it names one, else the one its benchmark's rows
    function gives it from the recorded results (rows recorded before ``source`` was added
    have none), else the benchmark's own."""
    data = report.load(run.name)
    try:
        given = {r.what: r.source for r in registry.get(run.name).rows(data)} if data else {}
    except (KeyError, TypeError, ValueError, AttributeError, ImportError):
        given = {}  # unreadable results: its section says so
    return [r.source or given.get(r.what) or run.name for r in run.rows]


def _section(name: str, report: Report, last: tuple[str, str], parts: list[str]) -> list[str]:
    bench = registry.get(name)
    lines = [f"## {bench.title} (`{bench.script}`)", ""]
    data = report.load(name)
    if data is None:
        return [*lines, "No results yet.", ""]
    lines.append(stamp(data).sentence(*last))
    for part in parts:
        found = stamp(report.load(part)).sentence(*last)
        found = found.removeprefix("Measured at: ")
        lines.append(
            f"The rows from `results/{part}{report.suffix}.json` were measured at: {found}"
        )
    lines.append("")
    try:
        lines.append(bench.section(data))
    except (KeyError, TypeError, ValueError) as exc:
        lines.append(f"(results/{name}{report.suffix}.json has an unexpected layout: {exc!r})")
    png = report.png(name)
    if png and (c.RESULTS_DIR / png).exists():
        lines += ["", f"![{bench.title}](results/{png})"]
    return [*lines, ""]


def _gpu_lines(m: dict[str, Any]) -> list[str]:
    """The GPU's lines of the machine's paragraph (none for a run without one)."""
    if "gpu" not in m:
        return []
    return [
        f"- GPU: {m['gpu']} ({m['device']}), {m['multiprocessors']} multiprocessors, "
        f"{m['gpu_memory_gib']} GiB; NVIDIA driver {m['driver']}; CUDA {m['cuda']}; TF32 "
        f"matmul {'on' if m['tf32_matmul'] else 'off'} (float32 matmul precision "
        f"{m['float32_matmul_precision']})",
    ]


def write(summary: Summary, report: Report) -> None:
    """Write the report's Markdown (``render``'s)."""
    report.markdown.write_text(render(summary, report))


def render(summary: Summary, report: Report) -> str:
    """The report's Markdown from ``summary`` (the runs' rows and machine) and the latest
    results: nothing but what they hold, so that the same files always render the same text.

    **Arguments:**

    - `summary`: the last run (``summary<suffix>.json``).
    - `report`: which report.

    **Returns:** the Markdown.
    """
    m = summary.machine
    last = str(m.get("source", ""))
    runs = complete(summary.runs, report)
    where = {r.name: sources(r, report) for r in runs}
    cells = [
        stamp(report.load(part)).cell(last, summary.finished)
        for r in runs
        for part in where[r.name]
    ]
    title = "Benchmark results on a GPU" if report.gpu else "Benchmark results"
    how = "`run_all.py --device cuda` (`gpu/run_on_gpu.sh`)" if report.gpu else "`nox -s bench`"
    lines = [
        f"# {title}",
        "",
        f"Generated by {how} (`benchmarks/run_all.py`); do not edit by hand. What "
        "each benchmark asks, and against whom, is indexed in [README.md](README.md); what "
        "each miss and borderline figure means, and what would close it, is analysed in "
        "[NOTES.md](NOTES.md).",
        "",
        f"Last run: {summary.finished} (UTC), {summary.total_seconds / 60:.1f} min in "
        f"all{' for the benchmarks run then' if summary.partial else ''}.",
        "",
        "## Machine",
        "",
        *_gpu_lines(m),
        f"- CPU: {m['cpu']} ({m['cpu_flags']}), {m['cores']} cores, {m['memory_gib']} GiB; "
        f"{m['threads_used']} torch threads",
        f"- Python {m['python']} on {m['platform']}",
        f"- Source of the last run: {last or 'not recorded'}; each row (last column) and "
        "each section names the commit and machine its own figures were measured on",
        f"- torch {m['torch']} (BLAS: {m['torch_blas']}); NumPy {m['numpy']} "
        f"(BLAS: {m['numpy_blas']}); torch-levenberg-marquardt {m['torch_levenberg_marquardt']}",
        "- Load: the cores are shared. 1-minute load average before → after each benchmark: "
        + "; ".join(r.load_text() for r in runs)
        + ". A load above 2 means other processes took CPU time from the measurement; "
        "figures taken then are pessimistic for both sides, and ratios are less reliable.",
        "",
        "## Every ratio against its target",
        "",
        table([one for r in runs for one in r.rows], cells),
        "",
        "`open`: one side did not reach the goal within its time cap and the bound does not "
        "decide the target; `info`: no target. An earlier run: the row's figures come from "
        "a run before the last, at the commit the row names.",
        "",
    ]
    for name in (r.name for r in runs):
        parts = sorted(set(where[name]) - {name})
        lines += _section(name, report, (last, summary.finished), parts)
    lines += [
        "## Analysis",
        "",
        "The misses and borderline figures above are analysed, with what would close each, in "
        "[NOTES.md](NOTES.md) (hand-written; it is not copied here).",
        "",
    ]
    return "\n".join(lines)
