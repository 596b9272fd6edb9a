"""The one door to NVML (``pynvml``, from ``nvidia-ml-py``).

NVML answers questions about GPUs without creating a CUDA context, so a process that asks
stays safe to fork. ``pynvml`` is imported on first use, never at import of this package.
Tests replace the module with ``use_module``; nothing else here knows which module
answers, so the whole package runs against a fake NVML.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from ._errors import NvmlError

# NVML's return codes (nvml.h), used when the module lacks the constant.
_LIBRARY_NOT_FOUND = 12
_DRIVER_NOT_LOADED = 9
_FUNCTION_NOT_FOUND = 13

_override: Any = None


class NvmlUnavailable(Exception):
    """NVML cannot be used here (not installed, no library, no driver): this is no error."""


def use_module(module: Any) -> Any:
    """Answer NVML calls from ``module`` (``None`` restores ``pynvml``); return the previous one.

    This is the seam for tests: a fake module with the ``nvml*`` functions and ``NVMLError``
    classes that the package calls.
    """
    global _override
    previous = _override
    _override = module
    return previous


def module() -> Any:
    """The NVML module in use: the injected one, else ``pynvml`` imported now."""
    if _override is not None:
        return _override
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable(
            "the NVML bindings are not installed (pip install nvidia-ml-py)"
        ) from exc


def _code(nvml: ModuleType | Any, name: str, default: int) -> int:
    value = getattr(nvml, name, default)
    return value if isinstance(value, int) else default


def is_nvml_error(nvml: Any, exc: BaseException) -> bool:
    """Whether ``exc`` was raised by NVML (an ``NVMLError`` of ``nvml``)."""
    base = getattr(nvml, "NVMLError", None)
    return isinstance(base, type) and isinstance(exc, base)


def is_missing_function(nvml: Any, exc: BaseException) -> bool:
    """Whether ``exc`` says the NVML library lacks the function the bindings called.

    Bindings newer than the driver call versioned functions (``…_v3``) the library does not
    have: NVML answers ``NVML_ERROR_FUNCTION_NOT_FOUND``, which pynvml's unversioned
    wrappers turn into ``NVMLLibraryMismatchError`` (not an ``NVMLError``).
    """
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type) and isinstance(exc, mismatch):
        return True
    missing = _code(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", _FUNCTION_NOT_FOUND)
    return is_nvml_error(nvml, exc) and getattr(exc, "value", None) == missing


@contextmanager
def session() -> Iterator[Any]:
    """``nvmlInit`` … ``nvmlShutdown`` around a block; yields the NVML module.

    Raises ``NvmlUnavailable`` when there is no NVML library or no driver (a machine
    without an NVIDIA GPU), and ``NvmlError`` when NVML is there but fails to start.
    """
    nvml = module()
    try:
        nvml.nvmlInit()
    except Exception as exc:
        if not is_nvml_error(nvml, exc):
            raise
        value = getattr(exc, "value", None)
        if value == _code(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", _LIBRARY_NOT_FOUND):
            raise NvmlUnavailable(
                "the NVML library (libnvidia-ml.so.1) is not found: no NVIDIA driver is "
                "installed on this machine"
            ) from exc
        if value == _code(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", _DRIVER_NOT_LOADED):
            raise NvmlUnavailable("the NVIDIA driver is not loaded on this machine") from exc
        raise NvmlError(
            f"NVML is installed but nvmlInit() failed with {type(exc).__name__}: {exc}. "
            "HINT: check that `nvidia-smi` works in this environment (driver and library "
            "versions must match; containers need the NVIDIA runtime)"
        ) from exc
    try:
        yield nvml
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:
            # Shutting down cannot undo what was read; a failure here must not hide it.
            if not is_nvml_error(nvml, exc):
                raise
