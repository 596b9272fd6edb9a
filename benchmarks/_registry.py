"""The benchmarks, one record each: what they ask, against whom, and how they run and report.

Every benchmark module defines ``BENCHMARK = Benchmark(...)``; ``MODULES`` names the module
of each benchmark, in the order in which ``run_all.py`` runs them and ``RESULTS.md`` shows
them. To add a benchmark: write ``bench_<name>.py`` with its ``BENCHMARK`` record and add
one line to ``MODULES``; ``nox -s bench -- <name>`` then runs it, ``RESULTS.md`` carries its
rows and section, and ``run_all.py --index`` lists it in the README's table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Results = dict[str, Any]
Row = dict[str, Any]

#: name -> module, in the order of RESULTS.md.
MODULES: dict[str, str] = {
    "jacobian": "bench_jacobian",
    "backends": "bench_backends",
    "step": "bench_step",
    "scale": "bench_scale",
    "strategy": "bench_strategy",
    "distributed": "bench_distributed",
    "memory": "bench_memory",
    "curve_fit": "bench_curve_fit",
    "small_fit": "bench_small_fit",
    "batch_fit": "bench_batch_fit",
    "cpufit": "bench_cpufit",
    "nist": "bench_nist",
    "pinn": "bench_pinn",
    "matrix_free": "bench_matrix_free",
    "pinn_suite": "bench_pinn_suite",
    "quality": "bench_quality",
    "subset_damping": "bench_subset_damping",
    "gpu": "bench_gpu",
    "matrix_free_gpu": "_gpu_matrix_free",
}
#: Names that stand for several benchmarks (``nox -s bench -- pinn``: both PINN benchmarks).
GROUPS: dict[str, tuple[str, ...]] = {"pinn": ("pinn", "pinn_suite")}


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its question, its peer and target, its measurement and its report.

    **Arguments:**

    - `name`: what ``nox -s bench -- NAME`` calls it; its results are ``results/<name>.json``.
    - `title`: the heading of its section in the report.
    - `question`, `peer`, `target`: one line each, for the README's index.
    - `run`: ``run(quick, device, budget)`` measures and returns the results (the module
      writes its own JSON and plots); ``quick`` takes small sizes, ``device`` is a torch
      device, ``budget`` is seconds for benchmarks that take a time budget (None: their own).
    - `rows`: the ratios of a result against their targets (``_common.row``).
    - `section`: a result as Markdown, for its section of the report.
    - `devices`: the device types it runs on.
    - `default`: run by ``nox -s bench`` without names (False: only when named).
    - `png`: a plot in ``results/`` shown under its section.
    - `echo`: prints a result as text after a run (None: its rows are the text).
    """

    name: str
    title: str
    question: str
    peer: str
    target: str
    run: Callable[[bool, str, float | None], Results]
    rows: Callable[[Results], list[Row]]
    section: Callable[[Results], str]
    devices: tuple[str, ...] = ("cpu",)
    default: bool = True
    png: str | None = None
    echo: Callable[[Results], None] | None = None

    @property
    def script(self) -> str:
        """The file that defines it."""
        return f"{MODULES[self.name]}.py"


def get(name: str) -> Benchmark:
    """The record of benchmark ``name`` (its module imported).

    **Raises:** ``KeyError`` for a name not in ``MODULES``, with the known names.
    """
    if name not in MODULES:
        raise KeyError(f"unknown benchmark {name!r}; the known ones are {list(MODULES)}")
    record: Benchmark = importlib.import_module(MODULES[name]).BENCHMARK
    if record.name != name:
        raise KeyError(f"{MODULES[name]}.py registers {record.name!r}, MODULES says {name!r}")
    return record


def expand(asked: list[str]) -> list[str]:
    """Names with groups expanded, duplicates dropped, in the order asked."""
    return list(dict.fromkeys(m for n in asked for m in GROUPS.get(n, (n,))))


def defaults() -> list[str]:
    """The names ``nox -s bench`` runs when none is given, in order."""
    return [n for n in MODULES if get(n).default]


def index() -> str:
    """The README's table: every benchmark, its question, peer and target."""
    lines = [
        "| name (`nox -s bench -- NAME`) | file | devices | question | peer | target |",
        "|---|---|---|---|---|---|",
    ]
    for name in MODULES:
        b = get(name)
        where = ", ".join(b.devices) + ("" if b.default else " (when named)")
        lines.append(
            f"| `{name}` | `{b.script}` | {where} | {b.question} | {b.peer} | {b.target} |"
        )
    return "\n".join(lines)
