"""One builder per kernel key: a lock file, held with ``flock`` while the kernel is built.

Whoever builds a key (a background builder, ``_curve.kernel_cache.background``, or a compile
inline, ``artifacts.save``) first locks ``.build-<key>.lock`` in the cache folder with
``fcntl.flock`` (exclusive) and writes into it its pid, its start time and what it builds,
for ``python -m marquardt.solver.cache list``. The kernel drops a ``flock`` when its holder
dies, SIGKILL included, so no lock outlives its builder: a file left by a killed builder
holds no lock, and the next builder of that key (or the listing) removes it. A holder
removes its file before it lets go; a builder that locked a file some other process
removed in between (its inode is no longer the path's) lets go and locks the new one.
Builders also queue on ``.build-queue.lock`` (``queued``), so that one compile runs at a
time on the machine however many kernels are missing. Where ``fcntl`` is missing (Windows) every builder proceeds: two may build one key, and
the last manifest written names a whole package (``artifacts``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["POLL_SECONDS", "QUEUE", "builds", "held"]

#: How often a builder that waits for another's lock tries it again, in seconds.
POLL_SECONDS = 0.25
#: The lock every builder takes in turn, after its key's: one compile at a time.
QUEUE = "queue"


def _path(folder: Path, key: str) -> Path:
    return folder / f".build-{key}.lock"


def _try_lock(path: Path) -> int | None:
    """A descriptor of ``path`` locked by this process, or None where another holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if fcntl is None:  # pragma: no cover - Windows
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # removed by its last holder in between: lock the file there now


@contextmanager
def held(folder: Path, key: str, about: dict[str, Any], wait: float) -> Iterator[bool]:
    """Hold the build lock of ``key`` in ``folder`` for the block.

    **Arguments:**

    - ``folder``: the cache folder (it exists and passed the trust check).
    - ``key``: the kernel's key; ``about``: what is built (written into the lock file).
    - ``wait``: the most seconds to wait for another builder of ``key`` to finish.

    **Returns:** (as the block's value) True once held; False where another builder held
    it for all of ``wait`` (then nothing is held).
    """
    path = _path(folder, key)
    deadline = time.monotonic() + wait
    fd = _try_lock(path)
    while fd is None and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        fd = _try_lock(path)
    if fd is None:
        yield False
        return
    try:
        os.ftruncate(fd, 0)
        record = {"pid": os.getpid(), "started": time.time(), "key": key, **about}
        os.write(fd, json.dumps(record, default=str).encode())
        yield True
    finally:
        path.unlink(missing_ok=True)  # while still held: the next holder makes a new one
        os.close(fd)


def builds(folder: Path) -> list[dict[str, Any]]:
    """The builds in progress in ``folder``: one dict per held lock (the holder's ``pid``,
    ``started``, ``key`` and what it builds). A lock file that no live process holds (its
    builder was killed) is removed here.

    **Arguments:** ``folder``: the cache folder.

    **Returns:** the builds, oldest first.
    """
    found = []
    for path in sorted(folder.glob(".build-*.lock")) if folder.is_dir() else []:
        if path == _path(folder, QUEUE):
            continue
        fd = _try_lock(path) if fcntl is not None else None
        if fd is not None:  # nobody holds it: left by a builder that died
            path.unlink(missing_ok=True)
            os.close(fd)
            continue
        try:
            record = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            record = {}
        if _alive(record.get("pid")):
            found.append(record)
    return sorted(found, key=lambda r: float(r.get("started", 0.0)))


def _alive(pid: Any) -> bool:
    """Whether a process with this pid runs (a holder writes its pid just after locking)."""
    if not isinstance(pid, int) or pid <= 0:
        return True  # locked, and its record not written yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
