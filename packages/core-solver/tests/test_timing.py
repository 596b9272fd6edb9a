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
