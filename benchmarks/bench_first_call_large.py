"""A new model's first call at M = 10⁶, float32 and float64: ``bench_first_call``'s rows
(its processes, figures and target), run apart because each of these rows takes minutes.
Every figure is one call in one fresh process (no repeats).

``python benchmarks/run_all.py first_call_large``.
"""

from __future__ import annotations

from typing import Any

from _registry import Options
from bench_first_call import main, rows, section

__all__ = ["ROWS", "rows", "run", "section"]

#: (M, dtype) of the run; ``--quick`` runs ``bench_first_call``'s quick row.
ROWS = ((1_000_000, "float32"), (1_000_000, "float64"))


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick, rows=None if o.quick else ROWS)
