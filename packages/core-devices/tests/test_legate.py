"""Legate's share: from a running runtime, from LEGATE_CONFIG, never by starting Legate."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from marquardt.devices import LegateConfigError, legate_gpu_count, legate_share
from marquardt.devices._legate import gpus_from_config


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("", None),
        ("--cpus 2 --fbmem 1024", None),
        ("--gpus 3", 3),
        ("--gpus=2 --fbmem 4000", 2),
        ("--cpus=1 --gpus 0", 0),
        ("--gpus 1 --gpus 4", 4),  # the last one wins, as on a command line
        ("--gpus-per-node 8", None),  # another flag that merely starts alike
    ],
)
def test_gpus_from_config(config: str, expected: int | None) -> None:
    assert gpus_from_config(config) == expected


@pytest.mark.parametrize("config", ["--gpus two", "--gpus", "--gpus=-1", "--gpus '3"])
def test_bad_config_is_named(config: str) -> None:
    with pytest.raises(LegateConfigError, match=r"LEGATE_CONFIG=.*HINT: "):
        gpus_from_config(config)


def test_share_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEGATE_CONFIG", "--cpus 1 --gpus 3 --sysmem 4000")
    share = legate_share()
    assert (share.gpus, share.source) == (3, "LEGATE_CONFIG")
    assert legate_gpu_count() == 3


def test_no_legate_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "legate" not in sys.modules
    share = legate_share()
    assert (share.gpus, share.source) == (0, "none")


def test_running_runtime_wins_over_config(
    fake_legate: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 1")
    fake_legate(2, 1)
    assert legate_share() == legate_share().__class__(2, "runtime")


def test_running_runtime_counts_per_node(fake_legate: Any) -> None:
    fake_legate(3, 4)  # 12 GPUs over 4 nodes: 3 on this one
    assert legate_gpu_count() == 3


def test_broken_runtime_falls_back_to_config(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise RuntimeError("not started")

    monkeypatch.setitem(sys.modules, "legate.core", type(sys)("legate.core"))
    sys.modules["legate.core"].get_machine = refuse  # type: ignore[attr-defined]
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 2")
    assert legate_share().source == "LEGATE_CONFIG"


def test_reading_the_share_never_imports_legate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEGATE_CONFIG", "--gpus 1")
    before = {name for name in sys.modules if name.split(".")[0] == "legate"}
    legate_gpu_count()
    after = {name for name in sys.modules if name.split(".")[0] == "legate"}
    assert after == before
