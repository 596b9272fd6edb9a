"""Keep freed host memory in the process heap between steps (glibc only).

Every step allocates and frees the same few tens of MiB on the host: activations of the
forward and backward passes, the trial forward, residuals. glibc's ``malloc`` serves
blocks above ``M_MMAP_THRESHOLD`` with fresh ``mmap`` pages and returns the top of the heap
to the system once more than ``M_TRIM_THRESHOLD`` is free there, so each step faults in
and zeroes those pages again: on the tutorial's network that was a tenth of a step, with
no change in peak RSS (benchmarks/RESULTS.md, the step benchmark). Raising both
thresholds once keeps the pages for reuse, as a caching
allocator would: blocks up to 32 MiB (glibc's largest allowed threshold) come from the
heap, and up to 1 GiB of free heap top is kept rather than trimmed.

This changes a process-wide setting, so it is done once, only on Linux with glibc, only
when an engine computes on the CPU, and never when ``MARQUARDT_JACOBIAN_HOST_HEAP=system``
(see ``_settings``). Memory the process frees stays counted in its resident size up to the
largest heap it reached; ``malloc_trim(0)`` returns it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

from . import _settings

__all__ = ["keep_host_heap"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30

_lock = threading.Lock()
_done: bool | None = None


def keep_host_heap() -> bool:
    """Raise glibc's mmap and trim thresholds once; whether they are raised now."""
    global _done
    with _lock:
        if _done is None:
            _done = _settings.host_heap() == "keep" and _raise_thresholds()
        return _done


def _raise_thresholds() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only (not musl)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # The mmap threshold first: setting either disables glibc's dynamic adjustment.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
