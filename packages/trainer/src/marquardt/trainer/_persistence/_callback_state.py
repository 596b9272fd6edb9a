"""Callback state in checkpoints: keys, capture, the check on resume, and restoring.

Every rank's callbacks contribute ``{key: {"class": name, "state": state}}`` for each
callback whose ``state_dict()`` is not empty; rank 0 writes the list of these, one per
rank (as it does for the RNG states), under the checkpoint's ``"callbacks"`` entry. On
resume each rank takes back its own rank's entry (rank 0's when the world size changed).

Keys: ``callback.state_key`` (the class name; ``EarlyStopping`` adds its ``monitor`` and
``mode``), and ``"<key> #n"`` for the n-th callback of a run sharing a key (n ≥ 2).

The rule when the callback list changed between the save and the resume:

- a callback with saved state under its key gets that state back (a changed setting, e.g.
  ``patience``, applies from then on);
- a callback with no saved state (added since, or stateless then) starts fresh;
- saved state that no callback of the resumed run claims (a stateful callback removed,
  or its ``monitor`` changed), or claimed by a callback of another class, is refused with
  :class:`CheckpointMismatchError` before any work: dropping it silently would make the
  resumed run stop at another step than the interrupted one would have;
- a checkpoint without the entry (written before callbacks were checkpointed) restores no
  callback state: every callback starts fresh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._callbacks._base import Callback
from .._errors import CheckpointMismatchError, ConfigError

#: The checkpoint entry that holds the callbacks' states (one mapping per rank).
ENTRY = "callbacks"


def keys(callbacks: Sequence[Callback]) -> list[str]:
    """The storage key of each callback, in order (repeated keys numbered from #2)."""
    seen: dict[str, int] = {}
    out = []
    for callback in callbacks:
        key = str(callback.state_key)
        seen[key] = seen.get(key, 0) + 1
        out.append(key if seen[key] == 1 else f"{key} #{seen[key]}")
    return out


def _check_plain(value: Any, where: str) -> None:
    """``value`` is made of what ``torch.load(weights_only=True)`` reads back."""
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise ConfigError(
                    f"{where} has the key {k!r} ({type(k).__name__}); checkpointed callback "
                    "state needs str keys. HINT: convert the keys with str() in state_dict()"
                )
            _check_plain(item, f"{where}[{k!r}]")
        return
    raise ConfigError(
        f"{where} is a {type(value).__name__}, which a checkpoint cannot hold (it is read "
        "back with torch.load(weights_only=True)). HINT: return None, bool, int, float, str, "
        "tensors, and lists or str-keyed dicts of those from state_dict()"
    )


def capture(callbacks: Sequence[Callback]) -> dict[str, dict[str, Any]]:
    """This rank's non-empty callback states by key, checked to be storable."""
    out: dict[str, dict[str, Any]] = {}
    for key, callback in zip(keys(callbacks), callbacks, strict=True):
        state = callback.state_dict()
        if not isinstance(state, dict):
            raise ConfigError(
                f"{type(callback).__name__}.state_dict() returned a {type(state).__name__}; "
                "a callback's state must be a dict. HINT: return {} when there is nothing to "
                "checkpoint"
            )
        if not state:
            continue
        _check_plain(state, f"{type(callback).__name__}.state_dict()")
        out[key] = {"class": type(callback).__qualname__, "state": state}
    return out


def saved_states(data: Mapping[str, Any]) -> list[dict[str, dict[str, Any]]]:
    """The per-rank callback states of a checkpoint (empty for an older checkpoint)."""
    entry = data.get(ENTRY)
    return [dict(e) for e in entry] if isinstance(entry, list | tuple) else []


def check(data: Mapping[str, Any], path: Path, callbacks: Sequence[Callback]) -> None:
    """Raise :class:`CheckpointMismatchError` if saved state has no callback to go to."""
    claimed = dict(zip(keys(callbacks), callbacks, strict=True))
    orphans: set[str] = set()
    wrong: dict[str, tuple[str, str]] = {}
    for entry in saved_states(data):
        for key, saved in entry.items():
            if key not in claimed:
                orphans.add(key)
            elif saved.get("class") != type(claimed[key]).__qualname__:
                wrong[key] = (str(saved.get("class")), type(claimed[key]).__qualname__)
    if orphans:
        raise CheckpointMismatchError(
            f"checkpoint {path} holds the state of callback(s) {sorted(orphans)}, which this "
            f"run does not have (its callbacks: {list(claimed) or 'none'}); resuming without "
            "that state could stop the run at another step than the interrupted run. HINT: "
            "resume with the same callbacks (same monitor and mode for EarlyStopping), or "
            "start afresh with resume_from=None"
        )
    if wrong:
        parts = ", ".join(f"{k!r}: saved by {a}, now {b}" for k, (a, b) in sorted(wrong.items()))
        raise CheckpointMismatchError(
            f"checkpoint {path} holds callback state for another class ({parts}). HINT: give "
            "the callbacks distinct state_key values, or resume with the same callbacks"
        )


def restore(
    data: Mapping[str, Any], callbacks: Sequence[Callback], rank: int, world_size: int
) -> None:
    """Give each callback its saved state (this rank's; rank 0's if the world changed)."""
    entries = saved_states(data)
    if not entries:
        return
    entry = entries[rank] if len(entries) == world_size else entries[0]
    for key, callback in zip(keys(callbacks), callbacks, strict=True):
        if key in entry:
            callback.load_state_dict(entry[key]["state"])
