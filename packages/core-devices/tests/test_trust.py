"""The cache's trust rule (``marquardt.devices.trust``): only folders and files this user
alone could have written pass; the machine-rate file follows it."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import pytest

from marquardt.devices import (
    MachineConstants,
    UntrustedCacheWarning,
    _machine,
    load_constants,
    store_constants,
    trust,
)

ROOT_ONLY = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="chown to another user needs root (the CI containers run the tests as root)",
)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trust, "_WARNED", set())
    monkeypatch.setattr(_machine, "_MEMORY", {})


def test_folders_are_created_0700_and_pass(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    trust.make_private(str(root), str(root / "compiled" / "deeper"))
    for path in (root, root / "compiled", root / "compiled" / "deeper"):
        assert path.stat().st_mode & 0o777 == 0o700
    assert trust.check(str(root), str(root / "compiled" / "deeper")).trusted
    # What does not exist yet passes: nothing is read from it.
    assert trust.check(str(root), str(root / "compiled" / "absent.json")).trusted


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o722])
def test_a_folder_others_can_write_fails_by_name(tmp_path: Path, mode: int) -> None:
    inner = tmp_path / "compiled"
    inner.mkdir(mode=0o700)
    inner.chmod(mode)
    verdict = trust.check(str(tmp_path), str(inner / "k.json"))
    assert not verdict.trusted and verdict.path == str(inner) and verdict.mode == mode
    assert "writable by" in verdict.why


def test_a_file_others_can_write_fails(tmp_path: Path) -> None:
    planted = tmp_path / "k.pt2"
    planted.write_text("x")
    planted.chmod(0o666)
    verdict = trust.check(str(tmp_path), str(planted))
    assert not verdict.trusted and verdict.path == str(planted)
    assert verdict.why == "is writable by group and others"


@ROOT_ONLY
def test_a_folder_of_another_user_fails(tmp_path: Path) -> None:
    inner = tmp_path / "compiled"
    inner.mkdir(mode=0o700)
    os.chown(inner, 12345, 12345)
    verdict = trust.check(str(tmp_path), str(inner))
    assert not verdict.trusted and verdict.owner == 12345
    assert "owned by uid 12345" in verdict.why


def test_the_warning_names_folder_owner_mode_and_fix_once(tmp_path: Path) -> None:
    tmp_path.chmod(0o777)
    verdict = trust.check(str(tmp_path), str(tmp_path / "x"))
    with pytest.warns(UntrustedCacheWarning) as caught:
        trust.warn_untrusted(verdict, "compiled kernels", "MARQUARDT_CACHE_DIR")
        trust.warn_untrusted(verdict, "compiled kernels", "MARQUARDT_CACHE_DIR")
    assert len(caught) == 1
    text = str(caught[0].message)
    for part in (
        str(tmp_path),
        f"owner uid {os.geteuid()}",
        "mode 0777",
        "chmod go-w",
        "MARQUARDT_CACHE_DIR",
        "HINT:",
    ):
        assert part in text


def test_the_check_costs_well_under_a_millisecond(tmp_path: Path) -> None:
    inner = tmp_path / "compiled"
    trust.make_private(str(tmp_path), str(inner))
    files = [inner / "k.json", inner / "k-0.pt2"]
    for path in files:
        path.write_text("x")
    started = time.perf_counter()
    for _ in range(200):
        assert trust.check(str(tmp_path), *map(str, files)).trusted
    # Four stat calls; the bound is generous so that a busy machine cannot fail it.
    assert (time.perf_counter() - started) / 200 < 1e-3


def test_a_planted_rates_file_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path))
    store_constants("cpu|x", MachineConstants(1e10, 2e9, 3e9))
    path = tmp_path / "machine.json"
    assert path.stat().st_mode & 0o777 == 0o600
    _machine._MEMORY.clear()
    assert load_constants("cpu|x") is not None
    _machine._MEMORY.clear()
    table = json.loads(path.read_text())
    table["machines"]["cpu|x"]["matmul_flops"] = 1e20  # what another account planted
    path.write_text(json.dumps(table))
    path.chmod(0o666)
    with pytest.warns(UntrustedCacheWarning, match="machine's measured rates"):
        assert load_constants("cpu|x") is None
    # Nor is it written: the planted file stays as it was.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UntrustedCacheWarning)
        store_constants("cpu|x", MachineConstants(1e10, 2e9, 3e9))
    assert json.loads(path.read_text())["machines"]["cpu|x"]["matmul_flops"] == 1e20


def test_a_fresh_cache_root_is_created_0700(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path / "new" / "cache"))
    store_constants("cpu|y", MachineConstants(1e10, 2e9, 3e9))
    assert (tmp_path / "new" / "cache").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "new" / "cache" / "machine.json").stat().st_mode & 0o777 == 0o600
