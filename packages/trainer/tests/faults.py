"""File systems that refuse writes, for the trainer's fault tests.

``small_disk`` is a real tmpfs of a few KiB where this process may mount one (root with
CAP_SYS_ADMIN, as in CI containers started privileged), else a folder behind the fault
layer below, which makes the same writes fail the same way. ``FaultyFiles`` wraps
``open`` (``builtins`` and ``io``, so ``pathlib`` and ``torch.save`` go through it) for
files under one folder: writes past a byte budget raise ``OSError(ENOSPC)`` after
writing what still fits (as a full disk does), and an ``errno`` makes every opening for
writing fail at once (``EROFS``, ``EACCES``, ``EDQUOT``). ``shutil.disk_usage`` reports
the budget left, so messages show the free space of the simulated disk.
"""

from __future__ import annotations

import builtins
import contextlib
import errno as errnos
import io
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch


class _Usage(NamedTuple):
    total: int
    used: int
    free: int


class _Limited:
    """A file opened for writing whose writes draw on the layer's budget."""

    def __init__(self, handle: Any, layer: FaultyFiles) -> None:
        self._handle = handle
        self._layer = layer

    def write(self, data: Any) -> int:
        size = len(data)
        room = self._layer.take(size)
        if room < size:
            if room:
                self._handle.write(data[:room])
                self._handle.flush()
            raise OSError(errnos.ENOSPC, os.strerror(errnos.ENOSPC))
        return int(self._handle.write(data))

    def __enter__(self) -> _Limited:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._handle)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


class FaultyFiles:
    """The fault layer over ``folder`` (see the module docstring)."""

    def __init__(
        self,
        folder: Path,
        *,
        budget: int | None = None,
        errno: int | None = None,
        only: str | None = None,
    ) -> None:
        self.folder = folder.resolve()
        self.budget = budget
        self.errno = errno
        self.only = only  # a part of the path: only those files fail
        self.refused = 0
        self._open = builtins.open

    def take(self, size: int) -> int:
        if self.budget is None:
            return size
        room = min(size, self.budget)
        self.budget -= room
        return room

    def _covers(self, file: Any, mode: str) -> bool:
        if not isinstance(file, str | bytes | os.PathLike) or not any(c in mode for c in "wax+"):
            return False
        path = Path(os.fsdecode(file)).resolve()  # TensorBoard opens bytes paths
        inside = path == self.folder or self.folder in path.parents
        if not inside:
            return False
        return self.only is None or self.only in str(path.relative_to(self.folder))

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if not self._covers(file, mode):
            return self._open(file, mode, *args, **kwargs)
        if self.errno is not None:
            self.refused += 1
            raise OSError(self.errno, os.strerror(self.errno), os.fsdecode(file))
        return _Limited(self._open(file, mode, *args, **kwargs), self)

    def disk_usage(self, path: Any) -> Any:
        real = _DISK_USAGE(path)
        if self.budget is None or self.only is not None:
            return real
        return _Usage(real.total, real.total - self.budget, self.budget)

    def save(self, obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        """``torch.save`` to a path writes through the layer (torch's own writer would not)."""
        if self._covers(f, "wb"):
            with self.open(f, "wb") as handle:
                _TORCH_SAVE(obj, handle, *args, **kwargs)
            return
        _TORCH_SAVE(obj, f, *args, **kwargs)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FaultyFiles:
        monkeypatch.setattr(builtins, "open", self.open)
        monkeypatch.setattr(io, "open", self.open)
        monkeypatch.setattr(shutil, "disk_usage", self.disk_usage)
        monkeypatch.setattr(torch, "save", self.save)
        return self


_DISK_USAGE = shutil.disk_usage
_TORCH_SAVE = torch.save


def can_mount_tmpfs() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextlib.contextmanager
def tmpfs(folder: Path, size: int) -> Iterator[Path | None]:
    """A tmpfs of ``size`` bytes mounted on ``folder``; None where none can be mounted."""
    folder.mkdir(parents=True, exist_ok=True)
    if not can_mount_tmpfs():
        yield None
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        yield None
        return
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


@contextlib.contextmanager
def small_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, kind: str
) -> Iterator[Path]:
    """A folder on a file system of ``size`` bytes: a real ``"tmpfs"`` (skipped where
    none can be mounted) or the ``"injected"`` fault layer."""
    folder = tmp_path / "disk"
    if kind == "injected":
        folder.mkdir()
        FaultyFiles(folder, budget=size).install(monkeypatch)
        yield folder
        return
    with tmpfs(folder, size) as mounted:
        if mounted is None:
            pytest.skip("mounting a tmpfs needs root with CAP_SYS_ADMIN; 'injected' runs instead")
        yield mounted


def chmod_protects() -> bool:
    """Whether a folder of mode 0o500 refuses this process's writes (not for root)."""
    return os.geteuid() != 0
