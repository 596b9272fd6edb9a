"""Files the run cannot write: one clear error instead of the file system's or torch's.

A full disk, a read-only mount, a folder without write permission or a used-up quota
reach the trainer as an ``OSError`` somewhere under a checkpoint, a metrics row or a
logger, or as torch's own ``RuntimeError: [enforce fail at inline_container.cc...]``
when ``torch.save`` ran out of room (the ``OSError`` hides in its context, or nowhere,
when torch wrote the file itself). ``writing`` turns each into one
``RunFilesError`` naming the file, the bytes it needed, the bytes free on
its file system, the newest checkpoint left whole, and what to do. Before a run starts,
``preflight`` checks that the run folder is writable and warns when its file system
holds fewer than two checkpoints of the model.
"""

from __future__ import annotations

import contextlib
import errno as errnos
import os
import re
import shutil
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._errors import RunFilesError

__all__ = ["checkpoint_bytes", "estimate_bytes", "os_error", "preflight", "write_error", "writing"]

#: torch's messages when its zip writer could not write (the errno is lost on the way).
_TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter", "iostream error")
_PROBE = ".marquardt-write-test"
#: What ``torch.save`` adds per tensor (zip record header, alignment) and for the rest.
RECORD_BYTES = 192
PICKLE_BYTES = 16384


#: The folder of a run's checkpoints, and the checkpoint at the best validation loss so far.
CHECKPOINT_DIR = "checkpoints"
BEST_NAME = "best.pt"
_NAME = re.compile(r"^ckpt_(\d+)\.pt$")


def replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """Make ``path`` whole or not at all: ``write(tmp)`` fills a temporary file beside it,
    which is then renamed over ``path`` (atomic on POSIX). On any failure, an interrupt
    included, the temporary file is removed and the failure raised as it came."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # never in place of the error being raised
            tmp.unlink(missing_ok=True)
        raise


def size_text(count: int | None) -> str:
    """``count`` bytes for a reader: ``1.5 MiB (1572864 bytes)``."""
    if count is None:
        return "an unknown number of bytes"
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024.0 or unit == "TiB":
            break
        value /= 1024.0
    return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit} ({count} bytes)"


def free_bytes(path: Path) -> int | None:
    """Bytes free to this user on the file system of ``path`` (its nearest existing folder)."""
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        return int(shutil.disk_usage(here).free)
    except OSError:
        return None


def _tensor_bytes(obj: Any) -> tuple[int, int]:
    """``(bytes, count)`` of the tensors in ``obj`` (nested mappings and sequences)."""
    if isinstance(obj, torch.Tensor):
        return int(obj.numel() * obj.element_size()), 1
    parts: list[Any] = []
    if isinstance(obj, Mapping):
        parts = list(obj.values())
    elif isinstance(obj, list | tuple):
        parts = list(obj)
    sizes = [_tensor_bytes(v) for v in parts]
    return sum(b for b, _ in sizes), sum(c for _, c in sizes)


def estimate_bytes(obj: Any) -> int:
    """About what ``torch.save`` writes for ``obj``: its tensors' bytes, plus a zip
    record (header, 64-byte alignment) per tensor and the pickled rest."""
    data, count = _tensor_bytes(obj)
    return data + RECORD_BYTES * count + PICKLE_BYTES


def checkpoint_bytes(model: nn.Module, loop_state: Mapping[str, Any]) -> int:
    """About the size of one checkpoint of ``model`` with the loop's state: the resume file
    and perceptrain's pair beside it, which hold the same states. A torch optimizer has no
    state before its first step: Adam's two moments are counted then (an upper bound for
    SGD's momentum), so the estimate does not grow after step one."""
    model_bytes = estimate_bytes(model.state_dict())
    state_bytes = estimate_bytes(loop_state)
    params, _ = _tensor_bytes(list(model.parameters()))
    return 2 * (model_bytes + max(state_bytes, 2 * params))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it, each once (torch keeps the cause as context)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        yield current
        seen.add(id(current))
        current = current.__cause__ or current.__context__


def os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` that ``exc`` is, or that caused it."""
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno is not None:
            return link
    return None


def interrupt(exc: BaseException) -> BaseException | None:
    """The Ctrl-C (or ``SystemExit``) under ``exc``: torch's writer turns one that lands
    in its write callback into ``RuntimeError: [enforce fail at inline_container.cc]``."""
    for link in _chain(exc):
        if isinstance(link, KeyboardInterrupt | SystemExit):
            return link
    return None


def _is_torch_write_failure(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _TORCH_WRITE_FAILURES)


def _hint(code: int | None, resumable: bool) -> str:
    then = "then resume with resume_from='latest'" if resumable else "then start the run again"
    if code == errnos.ENOSPC:
        return (
            "free space on that file system (old runs, old checkpoints), or point "
            f"root_folder (or log_folder) at a larger one; {then}"
        )
    if code == errnos.EDQUOT:
        return (
            "your disk quota there is used up: free some of it (`quota -s` shows it), or "
            f"point root_folder at a file system with quota left; {then}"
        )
    if code == errnos.EROFS:
        return (
            f"the file system is mounted read-only: point root_folder at a writable folder; {then}"
        )
    if code in (errnos.EACCES, errnos.EPERM):
        return (
            f"this process (uid {os.getuid()}) may not write there: fix the folder's "
            f"permissions, or point root_folder at a folder it owns; {then}"
        )
    return f"check that file system (dmesg, df), or point root_folder at another folder; {then}"


def write_error(
    what: str,
    path: Path,
    exc: BaseException,
    *,
    needed: int | None = None,
    last_checkpoint: Path | None = None,
    error: type[RunFilesError] = RunFilesError,
) -> RunFilesError | None:
    """The clear error for ``exc`` raised while writing ``path``; None when ``exc`` is
    not a failure of the file system (a bug of ours or of a logger: left as it is)."""
    cause = os_error(exc)
    if cause is None and not _is_torch_write_failure(exc):
        return None
    free = free_bytes(path)
    code = cause.errno if cause is not None else None
    if code is None and free is not None and needed is not None and free < needed:
        code = errnos.ENOSPC  # torch wrote the file itself and lost the errno
    if cause is not None:
        found = f"[Errno {code}] {cause.strerror or os.strerror(code or 0)}"
    elif code is not None:
        found = f"[Errno {code}] {os.strerror(code)} (torch said: {str(exc).strip()[:200]})"
    else:
        found = f"torch could not write it ({type(exc).__name__}: {str(exc).strip()[:200]})"
    room = (
        f"it needed about {size_text(needed)}, and {size_text(free)} are free there"
        if needed is not None
        else f"{size_text(free)} are free there"
    )
    if last_checkpoint is not None:
        kept = f"The last intact checkpoint is {last_checkpoint}."
    else:
        kept = "No checkpoint of this run is on disk yet."
    text = (
        f"cannot write the {what} {path}: {found}; {room}. {kept} "
        f"HINT: {_hint(code, last_checkpoint is not None)}"
    )
    return error(
        text,
        errno=code,
        path=str(path),
        needed=needed,
        free=free,
        last_checkpoint=None if last_checkpoint is None else str(last_checkpoint),
    )


@contextmanager
def writing(
    what: str,
    path: Path,
    *,
    needed: int | None = None,
    last_checkpoint: Path | Callable[[], Path | None] | None = None,
    error: type[RunFilesError] = RunFilesError,
) -> Iterator[None]:
    """A block that writes ``path``: a failure of the file system leaves it as ``error``
    (``last_checkpoint`` may be a function, asked only then)."""
    try:
        yield
    except RunFilesError:
        raise
    except (OSError, RuntimeError) as exc:
        stopped = interrupt(exc)
        if stopped is not None:
            raise stopped from None
        for link in _chain(exc):
            # The failed writer, still referenced by the finished frames, holds the
            # unlinked partial file open: free it, so the free space counts its room.
            traceback.clear_frames(link.__traceback__)
        last = last_checkpoint() if callable(last_checkpoint) else last_checkpoint
        clear = write_error(what, path, exc, needed=needed, last_checkpoint=last, error=error)
        if clear is None:
            raise
        raise clear from exc


def preflight(folder: Path, checkpoint_bytes: int, keep: int) -> None:
    """Before the first step: the run folder is writable (else ``RunFilesError``),
    and a ``RuntimeWarning`` when its file system holds fewer than two checkpoints."""
    probe = folder / _PROBE
    with writing("run folder", folder):
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"\0")
        probe.unlink()
    free = free_bytes(folder)
    if free is not None and free < 2 * checkpoint_bytes:
        warnings.warn(
            f"the file system of the run folder {folder} has {size_text(free)} free, fewer "
            f"than two checkpoints of this model ({size_text(checkpoint_bytes)} each; "
            f"keep_checkpoints={keep}): writing one may fail with no room for the next. "
            "HINT: free space there, or point root_folder at a larger file system",
            RuntimeWarning,
            stacklevel=2,
        )


def last_intact(path: Path) -> Path | None:
    """The newest checkpoint in ``path``'s folder other than ``path`` (``best.pt`` if it
    is the only one): written atomically, so whole. For a file of a run folder itself
    (perceptrain's ``model_*`` / ``opt_*`` pair), the run's ``checkpoints/`` folder."""
    folder = path.parent
    if folder.name != CHECKPOINT_DIR and (folder / CHECKPOINT_DIR).is_dir():
        folder = folder / CHECKPOINT_DIR
    numbered = [p for _, p in list_checkpoints(folder) if p != path]
    if numbered:
        return numbered[-1]
    best = folder / BEST_NAME
    return best if best != path and best.is_file() else None


def newest_checkpoint(run_folder: Path) -> Path | None:
    """The newest checkpoint of a run folder (numbered, else ``best.pt``), or None."""
    return last_intact(run_folder / CHECKPOINT_DIR / ".none")


def list_checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the numbered checkpoints in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)
