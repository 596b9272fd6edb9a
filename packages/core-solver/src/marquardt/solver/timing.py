"""Wall-clock time in microseconds, Legate-aware: a drop-in for ``legate.timing.time``.

``from marquardt.solver.timing import time`` replaces ``from legate.timing import time``:
``time()`` returns an integer number of microseconds, so ``(end - start) / 1e6`` is
seconds either way. When the Legate runtime is already in use in this process (its
modules are imported), Legate's own ``time`` is called: it waits for the queued Legate
work to finish, so a step that ends in asynchronous cuPyNumeric calls is timed honestly.
Otherwise ``time.perf_counter_ns`` is used. This never imports Legate by itself (importing
it would start the runtime).
"""

from __future__ import annotations

import sys
import time as _time
from typing import Any

__all__ = ["legate_running", "time"]

_UNITS = {"us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "ns": 1}


def legate_running() -> bool:
    """Whether Legate's runtime modules are loaded in this process (never imports them)."""
    return "legate.core" in sys.modules or "cupynumeric" in sys.modules


def time(units: str = "us") -> int:
    """The current time as an integer in ``units`` ("us" by default, like Legate's).

    Under Legate, blocks until queued Legate work is done (``legate.timing.time``).

    Arguments:
        units: ``"us"``, ``"ms"``, ``"s"`` or ``"ns"``.

    Returns:
        The time in ``units``, from an arbitrary start: only differences mean something.

    Raises:
        ValueError: other ``units``.
    """
    if units not in _UNITS:
        raise ValueError(
            f"time(units={units!r}) is not supported; expected one of {tuple(_UNITS)}. "
            "HINT: use the default 'us' and divide by 1e6 for seconds."
        )
    if legate_running():
        try:
            from legate.timing import time as legate_time
        except ImportError:  # a partial install: fall back to the host clock
            pass
        else:
            # Legate measures "us" or "ns" only; other units are derived from ns.
            if units in ("us", "ns"):
                value: Any = legate_time(units)
                return int(value)
            return int(legate_time("ns")) // _UNITS[units]
    return _time.perf_counter_ns() // _UNITS[units]
