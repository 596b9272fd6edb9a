"""Memory available to this process: the host's, from ``/proc/meminfo`` or ``os.sysconf``;
a CUDA device's, from the driver and PyTorch's caching allocator."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class HostMemory:
    """Bytes that can be used now (of RAM, or of a device for ``device_memory``).

    Arguments:
        available: the bytes that can be allocated now.
        source: where the figure was read, in words (``"MemAvailable in /proc/meminfo"``).
    """

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
    """The host memory that can be allocated now without swapping.

    Read from ``MemAvailable``, else from the free pages (``os.sysconf``), else from the
    total pages; 0, with ``source`` saying so, where none of these can be read.

    Arguments:
        meminfo: the path of the ``/proc/meminfo`` file to read.

    Returns:
        The bytes available and where they were read.
    """
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


def device_memory(device: torch.device) -> HostMemory:
    """Bytes a new PyTorch allocation can take on ``device`` now.

    On CUDA: the driver's free memory (``torch.cuda.mem_get_info``) plus what PyTorch's
    caching allocator holds reserved but unallocated, which it hands out again before it
    asks the driver for more. Without the second term, a process that has freed large
    tensors (an earlier step, another optimizer) sees far less than it can use. Elsewhere:
    the host's ``MemAvailable`` (``host_memory``).

    Arguments:
        device: the ``torch.device`` to ask about.

    Returns:
        The bytes available and where they were read.
    """
    if device.type != "cuda":
        return host_memory()
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if cached <= 0:
        return HostMemory(int(free), f"free memory of {device}")
    return HostMemory(
        int(free + cached), f"free memory of {device} + {cached / 2**30:.2f} GiB cached by torch"
    )
