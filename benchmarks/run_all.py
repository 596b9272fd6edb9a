"""Run any set of benchmarks, print every ratio beside its target, and write ``RESULTS.md``.

``nox -s bench`` runs ``python benchmarks/run_all.py``; ``nox -s bench -- NAME ...`` runs
those benchmarks (``pinn`` stands for both PINN benchmarks; ``run_all.py --index`` lists
every name). Each benchmark is a record in ``_registry.py`` and runs in a process of its
own (so that one cannot leave memory, threads or cached kernel choices to the next); this
script collects the rows of each (its ratios against their targets: PASS / MISS, "open"
when one side did not reach a goal within its time cap and the bound does not decide,
"info" for figures without a target), writes each benchmark's results to
``results/<name>.json`` and regenerates ``benchmarks/RESULTS.md`` (``_results_md.py``).

Options: ``--quick`` uses small sizes and short caps (development only: its files carry
``-quick`` in their names, ``RESULTS-quick.md`` among them, and git ignores them);
``--device cuda`` (or ``cuda:1``) runs the same benchmarks on that device (without names:
every one that runs there), each on its device path, into ``results/<name>-gpu.json`` and
``RESULTS-gpu.md``; ``--budget SECONDS`` is the time budget of the benchmarks that take one;
``--source TEXT`` says what was measured where the tree is not a git checkout;
``--wait-idle SECONDS`` waits up to that long for the 1-minute load average to drop below
``IDLE_LOAD`` before starting; ``--render`` rebuilds every run's rows from its recorded
results and rewrites summary.json and RESULTS.md (with ``--device cuda``: the GPU's) without
measuring; ``--index`` prints the
README's table of benchmarks; ``--check`` checks that every record loads, the README's table
is ``--index``'s, every recorded result renders, every run's recorded rows are what its
results give, and RESULTS.md (RESULTS-gpu.md too where
``summary-gpu.json`` is recorded) is byte for byte what the recorded results render to
(``nox -s bench`` runs it first, ``nox -s lint`` too). Every result records the commit and
machine it was measured on (``_stamp.py``), and the report shows them beside each row.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _child
import _common as c
import _machine
import _registry as registry
import _results_md as report
import torch
from _rows import Row, Run, row, text
from _stamp import MEASURED, stamp_record

IDLE_LOAD = 1.5
TIMEOUT = 1500.0


def child(name: str, quick: bool, device: str, budget: float | None) -> list[dict[str, Any]]:
    """Inside the child (``_child.py``): run the benchmark, print its report, return its rows."""
    bench = registry.get(name)
    options = registry.Options(quick, device, budget)
    results = bench.run(options)
    ended = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    results[MEASURED] = stamp_record(_machine.describe(device), ended)
    print(f"wrote {c.write_json(name + options.suffix, results)}", flush=True)
    if bench.echo is None:
        print(bench.section(results), flush=True)
    else:
        bench.echo(results)
    return [r.record() for r in bench.rows(results)]


def run_one(name: str, quick: bool, device: str, budget: float | None) -> Run:
    """Run one benchmark in a fresh process, streaming its output; its rows and timing."""
    load_before = _machine.load_average()
    start = time.perf_counter()
    records, error = _child.call(
        "run_all",
        "child",
        [name, quick, device, budget],
        timeout=TIMEOUT,
        log=lambda line: print(f"    | {line}", flush=True),
    )
    if not records:
        error = error or "no rows"
    rows = [Row.load(r) for r in records or []]
    if error:
        rows = [row(f"{name}: did not complete", None, None, detail=error)]
    return Run(
        name=name,
        rows=rows,
        seconds=time.perf_counter() - start,
        load_before=load_before,
        load_after=_machine.load_average(),
        error=error,
    )


def wait_for_idle(limit: float) -> float:
    """Wait (up to ``limit`` seconds) for the 1-minute load average to drop below IDLE_LOAD."""
    deadline = time.monotonic() + limit
    load = _machine.load_average()
    while load >= IDLE_LOAD and time.monotonic() < deadline:
        print(
            f"load average {load:.2f} ≥ {IDLE_LOAD}: waiting for the machine to settle", flush=True
        )
        time.sleep(min(60.0, max(1.0, deadline - time.monotonic())))
        load = _machine.load_average()
    return load


def chosen(asked: list[str], device: str) -> list[str]:
    """The benchmarks to run: those asked (groups expanded), else every default one that
    runs on ``device``'s type; a name that is unknown or not for that device is refused."""
    kind = device.split(":")[0]
    if not asked:
        if kind == "cpu":
            return registry.defaults()
        return [n for n in registry.MODULES if kind in registry.get(n).devices]
    names = registry.expand(asked, kind)
    unknown = [n for n in names if n not in registry.MODULES]
    if unknown:
        raise SystemExit(
            f"run_all: unknown benchmark(s) {unknown}; the known ones are "
            f"{list(registry.MODULES)}. HINT: python benchmarks/run_all.py --index"
        )
    elsewhere = [n for n in names if kind not in registry.get(n).devices]
    if elsewhere:
        runs = {n: list(registry.get(n).devices) for n in elsewhere}
        raise SystemExit(
            f"run_all: --device {device} was asked, but {runs} do not run there. "
            "HINT: leave them out, or run them with --device cpu"
        )
    return names


def first_difference(written: str, rendered: str) -> str:
    """Where ``written`` (a report's file) first differs from ``rendered`` (what its data
    render to): "" where they are equal."""
    if written == rendered:
        return ""
    old, new = written.split("\n"), rendered.split("\n")
    at = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
    if at is None:
        at = min(len(old), len(new))
        return f"line {at + 1}: the file has {len(old)} lines, the render {len(new)}"
    return f"line {at + 1}: the file has {old[at]!r}, the render {new[at]!r}"


def check_reports() -> list[str]:
    """What is wrong with the reports: RESULTS.md (and RESULTS-gpu.md where its summary is
    recorded) not byte for byte what ``results/*.json`` and ``summary*.json`` render to, or
    a run's recorded rows not what its results give."""
    problems = []
    for written in (report.CPU, report.Report("-gpu")):
        if not written.markdown.exists() or not written.summary_json.exists():
            if written is report.CPU:
                problems.append(f"{written.summary_json.name} or {written.markdown.name} missing")
            continue
        try:
            summary = report.Summary.load(json.loads(written.summary_json.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            problems.append(f"{written.summary_json.name} does not load: {exc!r}")
            continue
        fresh = report.rebuilt(summary, written)
        names, shown = [r.name for r in summary.runs], written.shown()
        if sorted(names) != sorted(shown):
            problems.append(
                f"{written.summary_json.name} holds the runs {names}, where the report shows "
                f"{shown}. HINT: python benchmarks/run_all.py --render"
                f"{' --device cuda' * written.gpu}"
            )
        stale = [
            r.name
            for r, f in zip(summary.runs, fresh.runs, strict=False)
            if r.name != f.name or [x.record() for x in r.rows] != [x.record() for x in f.rows]
        ]
        if stale or len(summary.runs) != len(fresh.runs):
            problems.append(
                f"{written.summary_json.name}'s rows are not what results/*.json give "
                f"(first: {(stale or ['a run without results'])[0]}). HINT: python "
                f"benchmarks/run_all.py --render{' --device cuda' * written.gpu}"
            )
        where = first_difference(written.markdown.read_text(), report.render(fresh, written))
        if where:
            problems.append(
                f"{written.markdown.name} is not what its data render to: {where}. HINT: "
                f"python benchmarks/run_all.py --render{' --device cuda' * written.gpu}"
            )
    return problems


def check() -> list[str]:
    """What is wrong with the records: a module without its record, a README table that is
    not ``--index``'s, recorded results that its rows or section cannot read, a report that
    is not what its data render to (``check_reports``)."""
    problems = []
    try:
        table = registry.index()
    except (ImportError, KeyError, AttributeError) as exc:
        return [f"a record does not load: {exc!r}"]
    if table not in (c.HERE / "README.md").read_text():
        problems.append("README.md's table is not run_all.py --index's. HINT: paste it over")
    for name in registry.MODULES:
        bench = registry.get(name)
        for recorded in (report.CPU, report.Report("-gpu")):
            data = recorded.load(name)
            if data is None:
                continue
            try:
                bench.rows(data)
                bench.section(data)
            except (KeyError, TypeError, ValueError) as exc:
                where = f"results/{name}{recorded.suffix}.json"
                problems.append(f"{where}: {bench.script} cannot read it: {exc!r}")
    return problems + check_reports()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (see --index)")
    parser.add_argument("--only", default="", help="a comma-separated list, as the names")
    parser.add_argument("--quick", action="store_true", help="small sizes (development)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:0")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--source", default="", help="what was measured (default: git)")
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--render", action="store_true", help="rewrite the report only")
    parser.add_argument("--index", action="store_true", help="print the README's table")
    parser.add_argument("--check", action="store_true", help="check the records and README")
    return parser


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    args = _parser().parse_args()
    signal.signal(signal.SIGTERM, _stop)
    if args.source:
        os.environ[c.SOURCE_VARIABLE] = args.source
    if args.index:
        print(registry.index())
        return 0
    if args.check:
        problems = check()
        print(
            "\n".join(problems)
            or f"{len(registry.MODULES)} benchmarks: records, README, results, reports agree"
        )
        return 1 if problems else 0
    written = report.Report(c.suffix(args.quick, args.device))
    if args.render:
        if not written.summary_json.exists():
            raise SystemExit(
                f"run_all: --render found no {written.summary_json.name}: no run on that "
                "device was recorded. HINT: run the benchmarks first (see gpu/README.md)"
            )
        recorded = report.Summary.load(json.loads(written.summary_json.read_text()))
        fresh = report.rebuilt(recorded, written)
        written.summary_json.write_text(json.dumps(fresh.record(), indent=2, default=str) + "\n")
        report.write(fresh, written)
        print(f"wrote {written.summary_json} and {written.markdown}")
        return 0
    names = chosen([n for n in [*args.names, *args.only.split(",")] if n], args.device)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(
            f"run_all: --device {args.device} was asked but torch.cuda.is_available() is "
            f"False (torch {torch.__version__}, built for CUDA {torch.version.cuda}). HINT: "
            "run it on a machine with an NVIDIA GPU, or pass --device cpu --quick for a dry run"
        )
    if args.wait_idle > 0:
        wait_for_idle(args.wait_idle)
    start = time.perf_counter()
    machine = _machine.describe(args.device)
    print(
        f"machine: {machine['cpu']}, {machine['cores']} cores; torch {machine['torch']} "
        f"({machine['torch_blas']}); numpy {machine['numpy']} ({machine['numpy_blas']}); "
        f"load {machine['load_average_1min']:.2f}; device {args.device}",
        flush=True,
    )
    runs = []
    for name in names:
        print(f"\n== {name} ==", flush=True)
        run = run_one(name, args.quick, args.device, args.budget)
        print(f"== {name}: {run.seconds:.0f} s ==", flush=True)
        print(text(run.rows), flush=True)
        runs.append(run)
    total = time.perf_counter() - start
    print("\n== every ratio against its target ==")
    print(text([one for r in runs for one in r.rows]))
    print(f"\ntotal {total / 60:.1f} min; load average now {_machine.load_average():.2f}")
    report.record(
        report.Summary(
            finished=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            total_seconds=total,
            machine=machine,
            runs=runs,
        ),
        written,
    )
    print(f"wrote {written.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
