"""The checkpoint file: its name and format, atomic writes, RNG states, and checks on reading.

Atomicity: a checkpoint is written to a temporary file in the same folder, flushed and
``fsync``-ed, then renamed over its final name (``os.replace`` is atomic on POSIX), and
the folder is ``fsync``-ed so the rename survives a crash. A process killed mid-write
leaves at most a stray ``.*.tmp-*`` file, which is never taken for a checkpoint: the
previous checkpoint stays whole.

Content: the model's ``state_dict`` without the ``module.`` prefix that
``DistributedDataParallel`` adds (so it loads into the bare model), the optimizer's (or
the LMA's) state, the RNG states of every rank (torch, CUDA, NumPy if installed, random),
the step and the position in the epoch, the sampler seed, the best validation loss and
the configuration. Everything is stored as tensors and plain values, so files load with
``torch.load(weights_only=True)``.

Loading never changes state before every check has passed: a missing file, an unreadable
(truncated) one, or one from another model (parameter names or shapes differ), another
optimizer or another loop each raise a ``CheckpointError`` saying which.
"""

from __future__ import annotations

import functools
import os
import random
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import _disk
from .._disk import (  # noqa: F401 (the file-system side of checkpoints, named here too)
    BEST_NAME,
    CHECKPOINT_DIR,
    last_intact,
    list_checkpoints,
    newest_checkpoint,
)
from .._errors import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointWriteError,
)

FORMAT = "marquardt.trainer.checkpoint"
VERSION = 1
#: Called between writing the temporary file and renaming it (tests inject crashes here).
_before_rename: Callable[[Path], None] | None = None


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint at ``step`` (zero-padded, so names sort by step)."""
    return f"ckpt_{step:09d}.pt"


def bare_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state without DDP's ``module.`` (or torch.compile's ``_orig_mod.``) prefix."""
    inner: nn.Module = model
    while isinstance(inner, nn.parallel.DistributedDataParallel | nn.DataParallel):
        inner = inner.module
    return {k: v.detach().cpu().clone() for k, v in strip_prefixes(inner.state_dict()).items()}


def strip_prefixes(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with the wrappers' ``module.`` and ``_orig_mod.`` key prefixes removed."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        for prefix in ("module.", "_orig_mod."):
            while key.startswith(prefix):
                key = key[len(prefix) :]
        out[key] = value
    return out


def model_signature(model: nn.Module) -> dict[str, list[int]]:
    """Parameter and buffer names with their shapes: what identifies "the same model"."""
    return {k: list(v.shape) for k, v in bare_state_dict(model).items()}


def rng_state() -> dict[str, Any]:
    """The RNG states of this process as tensors and plain values."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    version, internal, gauss = random.getstate()
    state["random"] = {
        "version": version,
        "state": torch.tensor(internal, dtype=torch.int64),
        "gauss": gauss,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        return state
    legacy: Any = np.random.get_state()
    name, keys, pos, has_gauss, cached = legacy
    state["numpy"] = {
        "name": str(name),
        "keys": torch.from_numpy(keys.astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the RNG states ``rng_state`` captured (those present here)."""
    torch.set_rng_state(state["torch"])
    if "random" in state:
        r = state["random"]
        random.setstate((r["version"], tuple(int(x) for x in r["state"].tolist()), r["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            return
        n = state["numpy"]
        keys = n["keys"].numpy().astype(np.uint32)
        np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached"]))


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_fsynced(obj: Any, tmp: Path) -> None:
    # torch writes the file itself: given a Python file object instead, a Ctrl-C landing
    # in its write callback left a writer whose destructor wrote to the closed file later,
    # and the process died in std::terminate.
    torch.save(obj, str(tmp))
    _fsync_file(tmp)
    if _before_rename is not None:
        _before_rename(tmp)


def atomic_save(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` with ``torch.save`` to ``path`` atomically (temp file, fsync, rename).

    A file system that refuses the write (full, read-only, no permission, quota) raises
    ``CheckpointWriteError`` naming the file, the room it needed and had, and the
    newest checkpoint left whole; no temporary file stays behind.
    """
    path = Path(path)
    with _disk.writing(
        "checkpoint",
        path,
        needed=_disk.estimate_bytes(obj),
        last_checkpoint=functools.partial(last_intact, path),
        error=CheckpointWriteError,
    ):
        _disk.replace_atomically(path, lambda tmp: _write_fsynced(obj, tmp))
    _fsync_dir(path.parent)
    return path


def prune(folder: str | Path, keep: int) -> None:
    """Delete all but the ``keep`` newest numbered checkpoints (``best.pt`` is kept)."""
    for _, path in list_checkpoints(folder)[:-keep]:
        path.unlink(missing_ok=True)


def find_latest(*run_folders: Path) -> Path | None:
    """The newest readable checkpoint of the first of ``run_folders`` that has one.

    A newest file that cannot be read (damaged outside the trainer's atomic writes) is
    skipped with a warning, so an unattended requeue falls back to the one before it.
    """
    for run in run_folders:
        for _, path in reversed(list_checkpoints(run / CHECKPOINT_DIR)):
            try:
                read_checkpoint(path)
            except CheckpointCorruptError as exc:
                warnings.warn(f"{exc}; trying an older checkpoint", RuntimeWarning, stacklevel=2)
                continue
            return path
    return None


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and check a checkpoint file's framing (not yet its fit to a model)."""
    path = Path(path)
    if not path.is_file():
        siblings = [p.name for _, p in list_checkpoints(path.parent)]
        hint = (
            f"checkpoints in {path.parent}: {', '.join(siblings[-3:])}"
            if siblings
            else "use resume_from='latest' to resume from the newest checkpoint if there is one, "
            "or None to start afresh"
        )
        raise CheckpointNotFoundError(
            f"resume_from={str(path)!r}: no such checkpoint file. HINT: {hint}"
        )
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        older = [p.name for _, p in list_checkpoints(path.parent) if p != path]
        hint = (
            f"resume from an earlier checkpoint ({', '.join(older[-2:])}) in {path.parent}"
            if older
            else "start afresh with resume_from=None"
        )
        size = path.stat().st_size
        raise CheckpointCorruptError(
            f"checkpoint {path} ({size} bytes) cannot be read: it is truncated or not a "
            f"checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). HINT: {hint}"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointCorruptError(
            f"{path} is a readable torch file but not a marquardt.trainer checkpoint (no "
            f"format={FORMAT!r} entry). HINT: to start from plain weights, call "
            "model.load_state_dict(torch.load(path)) before fit and set resume_from=None"
        )
    if int(data.get("version", 0)) > VERSION:
        raise CheckpointCorruptError(
            f"{path} has checkpoint format version {data.get('version')}, newer than this "
            f"marquardt.trainer understands ({VERSION}). HINT: upgrade marquardt-trainer"
        )
    return data


def check_fits(
    data: Mapping[str, Any], path: Path, model: nn.Module, kind: str, optimizer_class: str
) -> None:
    """Raise ``CheckpointMismatchError`` unless ``data`` belongs to this model and loop."""
    if data.get("kind") != kind:
        raise CheckpointMismatchError(
            f"checkpoint {path} was written by the {data.get('kind')!r} loop but this run uses "
            f"the {kind!r} loop. HINT: resume an LM run with an LMA and a DDP run with a "
            "torch optimizer, or start afresh with resume_from=None"
        )
    saved: dict[str, list[int]] = dict(data.get("model_signature", {}))
    current = model_signature(model)
    missing = sorted(set(current) - set(saved))
    unexpected = sorted(set(saved) - set(current))
    shapes = sorted(k for k in set(saved) & set(current) if list(saved[k]) != current[k])
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing in the checkpoint: {', '.join(missing[:5])}")
        if unexpected:
            parts.append(f"not in this model: {', '.join(unexpected[:5])}")
        if shapes:
            parts.append(
                "different shapes: "
                + ", ".join(f"{k} {saved[k]} vs {current[k]}" for k in shapes[:5])
            )
        raise CheckpointMismatchError(
            f"checkpoint {path} was written for another model ({'; '.join(parts)}). HINT: "
            "resume with the same model definition, point resume_from at this model's "
            "checkpoints, or start afresh with resume_from=None"
        )
    saved_class = data.get("optimizer_class")
    if saved_class and saved_class != optimizer_class:
        raise CheckpointMismatchError(
            f"checkpoint {path} holds the state of a {saved_class} but this run uses a "
            f"{optimizer_class}. HINT: resume with the same optimizer class, or start afresh "
            "with resume_from=None"
        )
