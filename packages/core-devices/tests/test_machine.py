"""The machine constants' cache: in the user's cache folder (here a temporary one),
written atomically, a corrupt file ignored; and the plan's time lines and choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marquardt.devices import (
    HostMemory,
    MachineConstants,
    _machine,
    load_constants,
    plan,
    store_constants,
)

GiB = 1 << 30


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_machine, "_MEMORY", {})
    return tmp_path


def test_constants_round_trip_through_the_cache_file(cache: Path) -> None:
    assert load_constants("cpu|x") is None
    store_constants("cpu|x", MachineConstants(1e10, 2e9, 3e9, source="measured"))
    _machine._MEMORY.clear()  # a later process: only the file remains
    found = load_constants("cpu|x")
    assert found == MachineConstants(1e10, 2e9, 3e9, source="cached")
    assert json.loads((cache / "machine.json").read_text())["format"] == _machine.CACHE_FORMAT


def test_a_corrupt_cache_is_ignored(cache: Path) -> None:
    (cache / "machine.json").write_text("{not json")
    assert load_constants("cpu|x") is None
    store_constants("cpu|x", MachineConstants(1e10, 2e9, 3e9))  # rewrites it whole
    _machine._MEMORY.clear()
    assert load_constants("cpu|x") is not None
    (cache / "machine.json").write_text(json.dumps({"format": "x", "machines": {}}))
    _machine._MEMORY.clear()
    assert load_constants("cpu|x") is None


def test_bad_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="positive finite"):
        MachineConstants(0.0, 1.0, 1.0)


def test_the_plan_chooses_by_time_with_rates_and_says_why() -> None:
    # P = 20,000, N = 100,000 fits 64 GiB as accumulate; on a slow CPU its 2·R·P² Gram
    # product takes minutes and the matrix-free step seconds: with rates, matrix-free.
    host = HostMemory(64 * GiB, "test")
    slow = MachineConstants(5e10, 1e10, 1e10)
    fast = MachineConstants(5e13, 5e12, 2e12)
    assert plan(20_000, 100_000, gpus=[], host=host).strategy == "accumulate"  # no rates
    chosen = plan(20_000, 100_000, gpus=[], host=host, machine=slow)
    assert chosen.strategy == "matrix_free" and "predicted over 10 times slower" in chosen.explain()
    assert "accumulate ≈" in chosen.explain() and "matrix_free ≈" in chosen.explain()
    assert plan(20_000, 100_000, gpus=[], host=host, machine=fast).strategy == "accumulate"
