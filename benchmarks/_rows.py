"""What every benchmark reports: typed rows (a figure against its target, with its verdict)
and runs (a benchmark's rows with the machine's load around it), and their text forms.

A benchmark's ``rows(results)`` returns ``Row`` values built by ``row``; ``run_all.py``
wraps them in a ``Run``; ``_results_md.py`` renders both. ``summary.json`` stores them as
plain objects (``Row.record``), read back by ``Row.load``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: A verdict's spelling in the Markdown tables (misses in bold).
SHOWN_VERDICT = {"PASS": "PASS", "MISS": "**MISS**"}


@dataclass(frozen=True)
class Row:
    """One figure of a benchmark against its target.

    **Arguments:**

    - `what`: the figure's name (unique across the report).
    - `value`: the figure (a ratio of ours to the peer's, a rate, a count), None where it
      was not measured.
    - `bound`: "" for a measured figure, "<" or ">" where only a bound is known.
    - `shown`: the figure as text, with its bound and unit.
    - `target`: the target as text ("≤ 0.5×"), "—" for a figure without one.
    - `verdict`: PASS, MISS, open (a bound that does not decide), info (no target), n/a.
    - `detail`: what was measured on each side (ours, the peer's), in words.
    - `source`: the results it comes from where they are not its benchmark's own
      (``results/<source>.json``, as a part run alone); "" for its benchmark's.
    """

    what: str
    value: float | None
    bound: str
    shown: str
    target: str
    verdict: str
    detail: str
    source: str = ""

    def record(self) -> dict[str, Any]:
        """The row as a plain object, for ``summary.json``."""
        return dataclasses.asdict(self)

    @classmethod
    def load(cls, record: dict[str, Any]) -> Row:
        """A row from ``record`` (``record``'s form; one recorded before ``source`` was
        added has none)."""
        return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record})


def _verdict(value: float | None, target: float | None, op: str, bound: str) -> str:
    """PASS / MISS / open / info / n/a for ``value`` against ``target`` (see ``row``)."""
    if value is None or value != value:
        return "n/a"
    if target is None:
        return "info"
    below, above = value <= target, value >= target
    if bound == "":
        return "PASS" if (below if op == "≤" else above) else "MISS"
    if bound == "<":  # the true figure is below ``value``
        if op == "≤":
            return "PASS" if below else "open"
        return "MISS" if below else "open"
    # the true figure is above ``value``
    if op == "≤":
        return "MISS" if above else "open"
    return "PASS" if above else "open"


def row(
    what: str,
    value: float | None,
    target: float | None,
    *,
    op: str = "≤",
    bound: str = "",
    detail: str = "",
    unit: str = "×",
) -> Row:
    """One figure against its target, with its verdict.

    **Arguments:**

    - `what`, `value`, `detail`: as ``Row``'s.
    - `target`: the target, None for a figure shown for information ("info").
    - `op`: "≤" (the figure must not exceed the target) or "≥".
    - `bound`: "" for a measured figure, "<" or ">" when only a bound is known (one side
      did not reach the goal within its time cap); a bound that does not decide the target
      gives "open".
    - `unit`: follows the figure and the target ("×" for ratios, "" for counts).

    **Returns:** the ``Row``.
    """
    missing = value is None or value != value
    return Row(
        what=what,
        value=value,
        bound=bound,
        shown="—" if missing else f"{bound}{value:.3g}{unit}",
        target="—" if target is None else f"{op} {target:g}{unit}",
        verdict=_verdict(value, target, op, bound),
        detail=detail,
    )


def time_ratio(
    what: str,
    times: tuple[float | None, float | None],
    runs: tuple[float, float],
    target: float,
    *,
    op: str = "≤",
    detail: str = "",
) -> Row:
    """The ratio of two times to the same goal, or a bound where one side did not reach it.

    **Arguments:**

    - `what`, `target`, `op`, `detail`: as ``row``'s.
    - `times`: (numerator, denominator): the seconds each side took to reach the goal,
      None for a side that did not reach it.
    - `runs`: the seconds each side ran for: a side that did not reach the goal would have
      taken longer than its run.

    **Returns:** the ``Row``: the measured ratio, a "<" or ">" bound, or n/a.
    """
    (num, den), (num_run, den_run) = times, runs
    if num is not None and den is not None:
        return row(what, num / den, target, op=op, detail=detail)
    if num is not None:  # the denominator's side did not get there: its time exceeds its run
        return row(what, num / max(den_run, 1e-9), target, op=op, bound="<", detail=detail)
    if den is not None:
        return row(what, num_run / den, target, op=op, bound=">", detail=detail)
    return row(what, None, target, op=op, detail=detail)


@dataclass
class Run:
    """One benchmark's run: its rows, how long it took and the load around it.

    **Arguments:**

    - `name`: the benchmark's name.
    - `rows`: its rows.
    - `seconds`: the run's wall time (0 where the rows were rebuilt from recorded results).
    - `load_before`, `load_after`: the 1-minute load average around it (None where the rows
      were rebuilt from recorded results).
    - `error`: why the run did not complete ("" where it did).
    """

    name: str
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    load_before: float | None = None
    load_after: float | None = None
    error: str = ""

    def record(self) -> dict[str, Any]:
        """The run as a plain object, for ``summary.json``."""
        return {**dataclasses.asdict(self), "rows": [r.record() for r in self.rows]}

    @classmethod
    def load(cls, record: dict[str, Any]) -> Run:
        """A run from ``record`` (``record``'s form)."""
        return cls(
            name=record["name"],
            rows=[Row.load(r) for r in record.get("rows", [])],
            seconds=record.get("seconds", 0.0),
            load_before=record.get("load_before"),
            load_after=record.get("load_after"),
            error=record.get("error", ""),
        )

    def load_text(self) -> str:
        """The load around the run, for the machine's paragraph."""
        if self.load_before is None or self.load_after is None:
            return f"{self.name} (figures from its own last run)"
        return f"{self.name} {self.load_before:.1f} → {self.load_after:.1f} ({self.seconds:.0f} s)"


def text(rows: list[Row]) -> str:
    """The rows as aligned text lines."""
    return "\n".join(
        f"  {r.what:<48s} {r.shown:>10s}   target {r.target:<8s} {r.verdict:<5s} {r.detail}"
        for r in rows
    )


def table(rows: list[Row], measured: list[str] | None = None) -> str:
    """The rows as a Markdown table, misses in bold.

    **Arguments:**

    - `rows`: the rows.
    - `measured`: where each row was measured (its commit and machine), a last column;
      None for a table without it.

    **Returns:** the table's Markdown.
    """
    head = ["| ratio | measured | target | verdict | figures |", "|---|---|---|---|---|"]
    if measured is not None:
        head = [head[0] + " commit; machine |", head[1] + "---|"]
    lines = head
    for i, r in enumerate(rows):
        verdict = SHOWN_VERDICT.get(r.verdict, r.verdict)
        cell = "" if measured is None else f" {measured[i]} |"
        lines.append(f"| {r.what} | {r.shown} | {r.target} | {verdict} | {r.detail} |{cell}")
    return "\n".join(lines)
