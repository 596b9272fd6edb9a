"""Figures the docs quote from the benchmarks must be figures the benchmark results hold.

The results are ``benchmarks/RESULTS.md`` and ``benchmarks/RESULTS-gpu.md``, both generated
from the JSON in ``benchmarks/results/`` (never edited by hand). In the prose of
``README.md`` and ``docs/**/*.md`` (fenced code, inline code, HTML comments and TeX maths
left out) two kinds of figure are checked:

1. every ratio, on any page: a number written against ``×`` (``0.94×``, ``1.8–2.0×``);
2. in a paragraph (or a table, or a list) that names a results file (``RESULTS.md``,
   ``RESULTS-gpu.md``, ``benchmarks/results/``), every measured figure: a time (µs, ms,
   s, min), a memory (KiB, MiB, GiB), a rate (fits/s) or a number in e-notation
   (``3.3e-6``).

A page's figure matches when a figure of the same kind in the results, rounded to the
significant digits the page shows, equals it: ``0.25 s`` matches ``245.2 ms`` and
``3.3e-6`` matches ``3.33e-06``; ``0.94×`` matches nothing when the results say ``1.15×``.
A figure that only ``benchmarks/NOTES.md`` (hand-written analysis) holds is not a result:
a page either cites NOTES.md without the number, or quotes a figure of RESULTS.md.

    python tools/docs_results.py                 # every page (nox -s docs runs this)
    python tools/docs_results.py docs/curve-fitting.md
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = (ROOT / "benchmarks" / "RESULTS.md", ROOT / "benchmarks" / "RESULTS-gpu.md")

# An exponent has at most three digits and ends the word: "87e9292" is a commit, not a number.
_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d{1,3}(?!\w))?"
#: unit -> (kind, factor to the kind's base unit)
UNITS = {
    "×": ("ratio", 1.0),
    "µs": ("time", 1e-6),
    "us": ("time", 1e-6),
    "ms": ("time", 1e-3),
    "s": ("time", 1.0),
    "min": ("time", 60.0),
    "KiB": ("memory", 1 / 1024),
    "MiB": ("memory", 1.0),
    "GiB": ("memory", 1024.0),
    "fits/s": ("rate", 1.0),
}
_UNIT = "|".join(sorted((re.escape(u) for u in UNITS if u != "×"), key=len, reverse=True))
# A figure with its unit, or a range of two sharing it ("1.8–2.0×", "27–34 ms"). The ratio
# is written against its number ("5.9×"); "512 × 512" is a size, not a ratio.
_FIGURE = re.compile(
    rf"(?<![\w.,/^-])(?P<a>{_NUMBER})(?:\s?[–-]\s?(?P<b>{_NUMBER}))?"
    rf"(?:(?P<ratio>×)|\s?(?P<unit>{_UNIT}))(?![\w/])"
)
_SCIENTIFIC = re.compile(r"(?<![\w.,/^-])(?P<a>\d+(?:\.\d+)?e[-+]?\d{1,3})(?![\w.])")
_ANY_NUMBER = re.compile(rf"(?<![\w.])(?P<a>{_NUMBER})")
_CITES = re.compile(r"RESULTS(?:-gpu)?\.md|benchmarks/results/")
# What a reader does not see as prose: inline code, HTML comments, TeX maths.
_HIDDEN = re.compile(
    r"`[^`\n]*`|<!--.*?-->|\\\(.*?\\\)|\\\[.*?\\\]|\$\$.*?\$\$", re.S
)  # fmt: skip
_FENCE = re.compile(r"^ *(`{3,}|~{3,})")


@dataclass(frozen=True)
class Figure:
    """One quoted figure: its kind, its value in the kind's base unit, and how it is written."""

    kind: str  # "ratio", "time", "memory", "rate" or "number"
    value: float
    shown: str
    step: float  # one unit of the last digit written, in the written unit
    line: int = 0
    factor: float = 1.0  # the written unit in the kind's base unit


def _step(number: str) -> float:
    """One unit of the last significant digit written: 0.01 for "0.25", 10 for "350"."""
    mantissa, _, exponent = number.replace(",", "").partition("e")
    if "." in mantissa:
        step = 10.0 ** -len(mantissa.split(".")[1])
    else:
        step = 10.0 ** (len(mantissa) - len(mantissa.rstrip("0"))) if mantissa.strip("0") else 1.0
    return step * 10.0 ** int(exponent or 0)


def _value(number: str) -> float:
    return float(number.replace(",", ""))


def figures(text: str, *, measured: bool) -> list[Figure]:
    """The figures quoted in a piece of prose.

    **Arguments:**

    - `text`: prose, with code and maths already blanked out.
    - `measured`: also every time, memory, rate and e-notation number, not only ratios.

    **Returns:** the figures in text order, a range giving two; `line` counts from 0.
    """
    found: list[Figure] = []
    taken: list[tuple[int, int]] = []
    for m in _FIGURE.finditer(text):
        unit = "×" if m["ratio"] else m["unit"]
        kind, factor = UNITS[unit]
        if kind != "ratio" and not measured:
            continue
        taken.append(m.span())
        line = text.count("\n", 0, m.start())
        for number in filter(None, (m["a"], m["b"])):
            shown = f"{number}{'×' if kind == 'ratio' else ' ' + unit}"
            value = _value(number) * factor
            found.append(Figure(kind, value, shown, _step(number), line, factor))
    if measured:
        for m in _SCIENTIFIC.finditer(text):
            if any(a <= m.start() < b for a, b in taken):
                continue
            line = text.count("\n", 0, m.start())
            found.append(Figure("number", _value(m["a"]), m["a"], _step(m["a"]), line))
    return found


def result_figures(texts: Iterable[str]) -> dict[str, list[float]]:
    """Every figure of the results by kind; "number" holds every number they print."""
    table: dict[str, list[float]] = {}
    for text in texts:
        for f in figures(text, measured=True):
            table.setdefault(f.kind, []).append(f.value)
        numbers = table.setdefault("number", [])
        numbers += [_value(m["a"]) for m in _ANY_NUMBER.finditer(text)]
    return table


def holds(results: dict[str, list[float]], figure: Figure) -> bool:
    """Whether a result of the figure's kind, rounded as the figure is written, equals it."""
    written = figure.value / figure.factor
    half = figure.step / 2 * (1 + 1e-9)
    return any(abs(v / figure.factor - written) <= half for v in results.get(figure.kind, ()))


def prose_paragraphs(page_text: str) -> list[tuple[int, str, bool]]:
    """(first line, prose, cites a results file) for each paragraph outside fenced code.

    **Arguments:**

    - `page_text`: a Markdown page.

    **Returns:** one entry per run of non-blank lines; hidden text (inline code, comments,
    maths) is blanked with spaces, newlines kept, so lines still count.
    """
    paragraphs: list[tuple[int, str, bool]] = []
    current: list[str] = []
    start, fence = 0, ""
    lines = page_text.splitlines()
    for number, line in enumerate([*lines, ""]):
        opened = _FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = ""
            continue
        if opened or not line.strip():
            if current:
                raw = "\n".join(current)
                hidden = _HIDDEN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), raw)
                paragraphs.append((start, hidden, bool(_CITES.search(raw))))
                current = []
            fence = opened.group(1) if opened else ""
            continue
        if not current:
            start = number
        current.append(line)
    return paragraphs


def check_page(page: Path, results: dict[str, list[float]]) -> list[str]:
    """The figures a page quotes that the results do not hold, one message each."""
    problems = []
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    for start, prose, cites in prose_paragraphs(page.read_text(encoding="utf-8")):
        for f in figures(prose, measured=cites):
            if holds(results, f):
                continue
            why = (
                "a ratio" if f.kind == "ratio" else f"a {f.kind} in a paragraph citing the results"
            )
            problems.append(
                f"{name}:{start + f.line + 1}: {f.shown} ({why}) is no figure of "
                "benchmarks/RESULTS.md or RESULTS-gpu.md. HINT: quote the figure the results "
                "hold (rerun the benchmark if the page is right and the results are old), or "
                "say it without the number"
            )
    return problems


def main(argv: list[str]) -> int:
    """Check the pages named (every page when none); print each problem, 1 when any."""
    results = result_figures(p.read_text(encoding="utf-8") for p in RESULTS if p.is_file())
    chosen = [Path(a).resolve() for a in argv] or [
        ROOT / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
    ]
    problems = [p for page in chosen for p in check_page(page, results)]
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"docs figures: {len(chosen)} pages, {len(problems)} figures the results do not hold")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
