"""The Legate-aware microsecond clock."""

from __future__ import annotations

import sys
import time as pytime

import pytest

from marquardt.solver import time
from marquardt.solver.timing import legate_running


def test_microseconds_without_legate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "legate.core", raising=False)
    monkeypatch.delitem(sys.modules, "cupynumeric", raising=False)
    assert not legate_running()
    start = time()
    pytime.sleep(0.02)
    elapsed = time() - start
    assert isinstance(start, int)
    assert 15_000 <= elapsed < 5_000_000
    assert time("ms") < time("us")


def test_unknown_units_refused() -> None:
    with pytest.raises(ValueError, match="HINT"):
        time("fortnights")


def test_uses_legates_clock_when_legate_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Legate the clock is legate.timing.time, which knows only "us" and "ns"."""
    import types

    asked: list[str] = []

    def legate_time(units: str = "us") -> int:
        if units not in ("us", "ns"):
            raise ValueError("time units must be 'us' or 'ns'")
        asked.append(units)
        return 7_000_000_000 if units == "ns" else 7_000_000

    timing_module = types.ModuleType("legate.timing")
    timing_module.time = legate_time  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "legate", types.ModuleType("legate"))
    monkeypatch.setitem(sys.modules, "legate.core", types.ModuleType("legate.core"))
    monkeypatch.setitem(sys.modules, "legate.timing", timing_module)
    assert legate_running()
    assert time() == 7_000_000
    assert time("ms") == 7_000
    assert time("s") == 7
    assert asked == ["us", "ns", "ns"]
