"""Every environment variable read is listed in _settings, and read nowhere else."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from marquardt.devices import _settings, cache_folder

PACKAGE = Path(_settings.__file__).parent


def test_only_settings_reads_the_environment() -> None:
    for path in PACKAGE.glob("*.py"):
        if path.name == "_settings.py":
            continue
        text = path.read_text()
        assert "os.environ" not in text and "getenv" not in text, path.name


def test_every_name_read_is_documented() -> None:
    text = (PACKAGE / "_settings.py").read_text()
    read = set(re.findall(r'_get\("([A-Z_]+)"\)', text))
    read |= {
        n
        for group in re.findall(r"_int_or_none\(([^)]*)\)", text)
        for n in re.findall(r'"([A-Z_]+)"', group)
    }
    assert read and read <= set(_settings.ENVIRONMENT)
    assert set(_settings.ENVIRONMENT) <= read  # and nothing is listed that is never read
    with pytest.raises(KeyError):
        _settings._get("HOME")


def test_process_place_prefers_torchrun_then_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert _settings.process_place() == _settings.ProcessPlace(5, 1, 8, None)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "x")  # unreadable: fall through to Slurm's
    assert _settings.process_place() == _settings.ProcessPlace(2, 1, 4, None)


def test_device_order_and_auto_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings.cuda_device_order() == "FASTEST_FIRST"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "pci_bus_id")
    assert _settings.cuda_device_order() == "PCI_BUS_ID"
    assert _settings.legate_auto_config()
    monkeypatch.setenv("LEGATE_AUTO_CONFIG", "0")
    assert not _settings.legate_auto_config()
    assert _settings.describe_visible() == "CUDA_VISIBLE_DEVICES unset"


@pytest.mark.parametrize(
    "platform,variable,expected",
    [
        ("linux", None, (".cache", "marquardt")),
        ("linux", "XDG_CACHE_HOME", ("xdg", "marquardt")),
        ("darwin", None, ("Library", "Caches", "marquardt")),
        ("darwin", "XDG_CACHE_HOME", ("Library", "Caches", "marquardt")),
        ("win32", None, ("AppData", "Local", "marquardt")),
        ("win32", "LOCALAPPDATA", ("xdg", "marquardt")),
        ("freebsd14", "XDG_CACHE_HOME", ("xdg", "marquardt")),
    ],
)
def test_cache_folder_is_the_platforms(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    platform: str,
    variable: str | None,
    expected: tuple[str, ...],
) -> None:
    # The home folder and the platform's variable point into tmp_path; the root override
    # then wins over both, with ~ expanded and surrounding blanks dropped.
    monkeypatch.setenv("HOME", str(tmp_path))
    if variable is not None:
        monkeypatch.setenv(variable, str(tmp_path / "xdg"))
    monkeypatch.setattr(sys, "platform", platform)
    assert _settings.cache_folder() == os.path.join(tmp_path, *expected)
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", " ~/own ")
    assert cache_folder() == os.path.join(tmp_path, "own")
