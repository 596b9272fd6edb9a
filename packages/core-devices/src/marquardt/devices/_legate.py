"""How many of the visible GPUs Legate holds, read without ever starting Legate.

Legate takes the first K visible CUDA ordinals (its ``--gpus K``); the model side gets the
rest. K comes, in order of trust, from:

1. a running Legate runtime: if ``legate.core`` is already imported, the runtime has
   started (importing it starts it) and its machine counts its GPUs;
2. ``--gpus K`` in ``LEGATE_CONFIG``, which the runtime will read once when it starts;
3. otherwise 0. Legate's automatic configuration would reserve every GPU if it started
   later with no ``--gpus``; the share reports that as a note, not as a count.

``legate --gpu-bind`` rewrites ``CUDA_VISIBLE_DEVICES`` for the whole process, so nothing
here infers the share from that variable.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Literal

from . import _settings
from ._errors import LegateConfigError

Source = Literal["runtime", "LEGATE_CONFIG", "none"]


@dataclass(frozen=True)
class LegateShare:
    """How many of the first visible ordinals Legate holds, and where that was read.

    Arguments:
        gpus: the number of GPUs Legate holds (the first visible ordinals).
        source: where ``gpus`` was read: ``"runtime"`` (a running Legate),
            ``"LEGATE_CONFIG"`` (its ``--gpus K``) or ``"none"`` (0, nothing says more).
        note: a warning in words with a hint, or ``""``.
    """

    gpus: int
    source: Source
    note: str = ""


def gpus_from_config(config: str) -> int | None:
    """``K`` from ``--gpus K`` or ``--gpus=K`` in a ``LEGATE_CONFIG`` string (``None`` if absent).

    The last occurrence wins, as in any command line.
    """
    try:
        words = shlex.split(config)
    except ValueError as exc:
        raise LegateConfigError(
            f"LEGATE_CONFIG={config!r} cannot be split into flags ({exc}). "
            "HINT: balance the quotes, e.g. LEGATE_CONFIG='--gpus 2 --fbmem 4000'"
        ) from exc
    found: str | None = None
    for position, word in enumerate(words):
        if word == "--gpus":
            found = words[position + 1] if position + 1 < len(words) else ""
        elif word.startswith("--gpus="):
            found = word.split("=", 1)[1]
    if found is None:
        return None
    if not found.isdigit():
        raise LegateConfigError(
            f"LEGATE_CONFIG={config!r} gives --gpus {found!r}, which is not a whole number "
            "of GPUs. HINT: write --gpus K with K >= 0, e.g. LEGATE_CONFIG='--gpus 2'"
        )
    return int(found)


def _running_gpus() -> int | None:
    """GPUs per node of an already started Legate runtime, or ``None`` if none is running."""
    core: Any = sys.modules.get("legate.core")
    if core is None:
        return None
    try:
        machine = core.get_machine()
        total = int(machine.count(core.TaskTarget.GPU))
        runtime = core.get_legate_runtime()
        nodes = int(getattr(runtime, "node_count", 1) or 1)
    except Exception:
        # A half-imported or stub legate.core says nothing reliable; fall back to the config.
        return None
    return total // max(nodes, 1)


def running_cpus() -> int | None:
    """CPU and OpenMP processors per node of an already started Legate runtime, or ``None``
    if none is running (never starts one)."""
    core: Any = sys.modules.get("legate.core")
    if core is None:
        return None
    try:
        machine = core.get_machine()
        total = sum(
            int(machine.count(target)) for target in (core.TaskTarget.CPU, core.TaskTarget.OMP)
        )
        nodes = int(getattr(core.get_legate_runtime(), "node_count", 1) or 1)
    except Exception:
        return None  # a half-imported or stub legate.core says nothing reliable
    return total // max(nodes, 1)


def legate_share() -> LegateShare:
    """Legate's share of the visible GPUs, with where it was read (never starts Legate).

    Returns:
        The count from a running runtime, else from ``--gpus`` in ``LEGATE_CONFIG``, else 0
        (with a note where Legate is installed and would take every GPU if it started).

    Raises:
        LegateConfigError: ``LEGATE_CONFIG`` cannot be split into flags, or its ``--gpus``
            is not a whole number.
    """
    running = _running_gpus()
    if running is not None:
        return LegateShare(running, "runtime")
    configured = gpus_from_config(_settings.legate_config())
    if configured is not None:
        return LegateShare(configured, "LEGATE_CONFIG")
    note = ""
    # Only worth saying where Legate is installed: elsewhere it cannot start at all.
    if _settings.legate_auto_config() and importlib.util.find_spec("legate") is not None:
        note = (
            "LEGATE_CONFIG names no --gpus: if Legate starts later it reserves every GPU. "
            "HINT: launch with legate --gpus K, or set LEGATE_CONFIG='--gpus K'"
        )
    return LegateShare(0, "none", note)


def legate_gpu_count() -> int:
    """How many of the visible GPUs (the first ones) Legate holds or will hold.

    Returns:
        [`legate_share`][marquardt.devices.legate_share]'s ``gpus``.

    Raises:
        LegateConfigError: ``LEGATE_CONFIG`` cannot be read (as for ``legate_share``).
    """
    return legate_share().gpus
