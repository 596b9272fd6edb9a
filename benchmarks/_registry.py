"""The benchmarks, one record each: what they ask, against whom, and how they run and report.

``benchmarks.toml`` lists every benchmark (its module, title, question, peer, target,
devices), in the order in which ``run_all.py`` runs them and ``RESULTS.md`` shows them.
Each module provides three functions: ``run(options)`` measures and returns its results (a
JSON-able dict; the module writes ``results/<name>.json`` and its plots), ``rows(results)``
its figures against their targets (``_rows.row``), ``section(results)`` its section of the
report in Markdown. To add a benchmark: write ``bench_<name>.py`` with those three and add
its entry to ``benchmarks.toml``; ``nox -s bench -- <name>`` then runs it, ``RESULTS.md``
carries its rows and section, and ``run_all.py --index`` lists it in the README's table.
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from _common import suffix
from _rows import Row

Results = dict[str, Any]

#: Every benchmark's entry in ``benchmarks.toml``, by name, in order.
ENTRIES: dict[str, dict[str, Any]] = tomllib.loads(
    (Path(__file__).resolve().parent / "benchmarks.toml").read_text()
)
#: name -> module, in the order of RESULTS.md.
MODULES: dict[str, str] = {name: entry["module"] for name, entry in ENTRIES.items()}
#: Names that stand for several benchmarks (``nox -s bench -- pinn``: both PINN benchmarks).
GROUPS: dict[str, tuple[str, ...]] = {"pinn": ("pinn", "pinn_suite")}


@dataclass(frozen=True)
class Options:
    """How a run was asked for, the same for every benchmark.

    **Arguments:**

    - `quick`: small sizes and short caps (development; never recorded as the figures).
    - `device`: a torch device ("cpu", "cuda", "cuda:1").
    - `budget`: seconds, for the benchmarks that take a time budget (None: their own).
    """

    quick: bool = False
    device: str = "cpu"
    budget: float | None = None

    @property
    def suffix(self) -> str:
        """What this run adds to the names of its files (``_common.suffix``)."""
        return suffix(self.quick, self.device)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its entry in ``benchmarks.toml`` and its module's functions.

    **Arguments:**

    - `name`: what ``nox -s bench -- NAME`` calls it; its results are ``results/<name>.json``.
    - `title`: the heading of its section in the report.
    - `question`, `peer`, `target`: one line each, for the README's index.
    - `module`: the module that measures and reports it.
    - `devices`: the device types it runs on.
    - `default`: run by ``nox -s bench`` without names (False: only when named).
    - `png`: a plot in ``results/`` shown under its section.
    """

    name: str
    title: str
    question: str
    peer: str
    target: str
    module: ModuleType
    devices: tuple[str, ...] = ("cpu",)
    default: bool = True
    png: str | None = None

    @property
    def script(self) -> str:
        """The file that defines it."""
        return f"{MODULES[self.name]}.py"

    def run(self, options: Options) -> Results:
        """Measure: the module's ``run(options)``."""
        results: Results = self.module.run(options)
        return results

    def rows(self, results: Results) -> list[Row]:
        """The figures of ``results`` against their targets."""
        rows: list[Row] = self.module.rows(results)
        return rows

    def section(self, results: Results) -> str:
        """``results`` as Markdown, for its section of the report."""
        text: str = self.module.section(results)
        return text

    @property
    def echo(self) -> Callable[[Results], None] | None:
        """What prints a result after a run, beside its rows (the module's ``echo``)."""
        return getattr(self.module, "echo", None)


def get(name: str) -> Benchmark:
    """The record of benchmark ``name`` (its module imported).

    **Raises:** ``KeyError`` for a name not in ``benchmarks.toml``, with the known names.
    """
    if name not in ENTRIES:
        raise KeyError(f"unknown benchmark {name!r}; the known ones are {list(MODULES)}")
    entry = dict(ENTRIES[name])
    module = importlib.import_module(entry.pop("module"))
    for hook in ("run", "rows", "section"):
        if not callable(getattr(module, hook, None)):
            raise KeyError(f"{MODULES[name]}.py has no function {hook}() for benchmark {name!r}")
    entry["devices"] = tuple(entry.get("devices", ("cpu",)))
    return Benchmark(name=name, module=module, **entry)


def expand(asked: list[str], kind: str = "cpu") -> list[str]:
    """Names with groups expanded (to their members that run on device type ``kind``),
    duplicates dropped, in the order asked."""
    members = {
        group: tuple(m for m in names if kind in ENTRIES[m].get("devices", ("cpu",)))
        for group, names in GROUPS.items()
    }
    return list(dict.fromkeys(m for n in asked for m in members.get(n, (n,))))


def defaults() -> list[str]:
    """The names ``nox -s bench`` runs when none is given, in order."""
    return [n for n, entry in ENTRIES.items() if entry.get("default", True)]


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
