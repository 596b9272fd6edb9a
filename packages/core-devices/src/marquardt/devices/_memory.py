"""Host memory available to this process, from ``/proc/meminfo`` or ``os.sysconf``."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class HostMemory:
    """Bytes of RAM that can be used now, and where the figure was read."""

    available: int
    source: str


def _meminfo(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key == "MemAvailable":
                    return int(rest.split()[0]) * 1024  # the file counts kB (KiB)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _sysconf(name: str) -> int | None:
    try:
        pages = os.sysconf(name)
        size = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def host_memory(meminfo: str = "/proc/meminfo") -> HostMemory:
    """``MemAvailable`` (what can be allocated without swapping), else free, else total pages."""
    found = _meminfo(meminfo)
    if found is not None:
        return HostMemory(found, f"MemAvailable in {meminfo}")
    free = _sysconf("SC_AVPHYS_PAGES")
    if free is not None:
        return HostMemory(free, "os.sysconf(SC_AVPHYS_PAGES)")
    total = _sysconf("SC_PHYS_PAGES")
    if total is not None:
        return HostMemory(total, "os.sysconf(SC_PHYS_PAGES), total RAM")
    return HostMemory(0, "unknown (no /proc/meminfo, no sysconf)")
