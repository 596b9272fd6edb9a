"""Errors of ``marquardt.devices``.

Each message says what was asked, what was found and how to fix it (after ``HINT:``).
"""

from __future__ import annotations


class DeviceError(ValueError):
    """A device request that this machine, or Legate's share of it, cannot satisfy."""


class LegateConfigError(ValueError):
    """``LEGATE_CONFIG`` cannot be read, or asks for GPUs that are not visible."""


class NvmlError(RuntimeError):
    """NVML is installed and a driver is present, but NVML fails to answer."""


class CleanupError(RuntimeError):
    """GPU processes cannot be stopped safely here (no ``/proc``, or no NVML to ask)."""


class UntrustedCacheWarning(UserWarning):
    """A folder or file of the cache could be written by another account: nothing is read
    from it or written to it, and the work goes on without it (``marquardt.devices.trust``)."""
