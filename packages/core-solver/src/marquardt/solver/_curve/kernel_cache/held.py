"""The kernels and verdicts ``curve_fit_batch``'s compiled path holds in this process.

A process keeps the kernels it loaded or compiled (``CACHE``, least recently used dropped
first), the shapes whose compile failed, kept kernels found untrustworthy, the shapes
looked for on disk and not found, and the keys it builds in the background, so that a loop
of fits looks for each once. ``serving`` finds the kernel a chunk runs in (padding a chunk
with fewer fits up to it, ``padding``), ``size_for`` the fits a kernel is compiled for.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..._errors import CompileWarning
from . import artifacts, kernel_key

__all__ = [
    "ABSENT",
    "BAD",
    "CACHE",
    "CACHE_SIZE",
    "FAILED",
    "PAD_SHARE",
    "SPAWNED",
    "TAIL_FITS",
    "Kernel",
    "forget",
    "no_compiler",
    "padding",
    "rows",
    "serving",
    "size_for",
    "warn_once",
]

#: A chunk holding at least this share of the compiled fits is padded up to them and runs
#: compiled; a smaller one runs eagerly.
PAD_SHARE = 0.4
#: The fewest fits a second, smaller kernel is compiled for: the fits still running late
#: in a chunk, once fewer than ``PAD_SHARE`` of it, run in a kernel for ``PAD_SHARE`` of
#: the chunk rather than eagerly (where each iteration costs some milliseconds of dispatch
#: however few the fits) when that kernel holds at least this many fits.
TAIL_FITS = 1024
#: Compiled iterations kept per process (least recently used dropped first).
CACHE_SIZE = 16


@dataclass
class Kernel:
    """One compiled iteration and the fits it was compiled for."""

    fits: int
    run: Callable[..., tuple[torch.Tensor, ...]]
    #: The model, held so that a key made from its id stays its own while cached.
    model: Any


def size_for(chunk: int, fits: int) -> int:
    """The fits to compile for ``fits`` running fits of a call with ``chunk``-fit chunks:
    ``chunk``, or for the fits still running late in a chunk ``chunk``·``PAD_SHARE`` when
    that is at least ``TAIL_FITS``; 0 where ``fits`` fits neither (they run eagerly)."""
    tail = round(chunk * PAD_SHARE)
    for size in (chunk, tail if tail >= TAIL_FITS else 0):
        if size and PAD_SHARE * size <= fits <= size:
            return size
    return 0


def padding(fits: int, size: int | None, device: torch.device) -> torch.Tensor | None:
    """The rows that pad ``fits`` fits to ``size``: these, then copies of the first (whose
    results are dropped); None where nothing is padded (``size`` None or ``fits``)."""
    if size is None or fits == size:
        return None
    index = torch.arange(size, device=device)
    return torch.where(index < fits, index, 0)


def rows(tensors: list[torch.Tensor]) -> Callable[[int | None], list[torch.Tensor]]:
    """``tensors`` (first axis: the fits) padded to a given number of fits (``padding``)."""

    def padded(size: int | None) -> list[torch.Tensor]:
        index = padding(tensors[0].shape[0], size, tensors[0].device)
        return tensors if index is None else [t[index] for t in tensors]

    return padded


CACHE: OrderedDict[tuple[Any, ...], Kernel] = OrderedDict()
FAILED: set[tuple[Any, ...]] = set()
#: Keys of kept kernels found untrustworthy and not rebuilt yet by this process (a look
#: without a trace, ``ready``, leaves the rebuild to the call that follows).
BAD: set[str | None] = set()
#: Keys this process has started a background build of.
SPAWNED: set[str] = set()
#: (shapes, fits) looked for on disk and not found by this process, most recent last.
ABSENT: OrderedDict[tuple[Any, ...], None] = OrderedDict()
_WARNED: OrderedDict[Any, None] = OrderedDict()


def serving(shapes: tuple[Any, ...], fits: int) -> Kernel | None:
    """The cached kernel for these shapes with the fewest fits that still holds ``fits``
    while ``fits`` is at least ``PAD_SHARE`` of them (marked most recently used)."""
    found = [
        (key, k)
        for key, k in CACHE.items()
        if key[0] == shapes and PAD_SHARE * k.fits <= fits <= k.fits
    ]
    if not found:
        return None
    key, kernel = min(found, key=lambda item: item[1].fits)
    CACHE.move_to_end(key)
    return kernel


def warn_once(f: Callable[..., Any], reason: str) -> None:
    key = kernel_key.identity(f)
    if key in _WARNED:
        return
    _WARNED[key] = None
    while len(_WARNED) > 4 * CACHE_SIZE:
        _WARNED.popitem(last=False)
    name = getattr(f, "__qualname__", type(f).__name__)
    warnings.warn(
        f"curve_fit_batch could not compile its iteration for the model {name} and runs it "
        f"eagerly (same results, slower): {reason}. HINT: write f without Python control "
        "flow on tensor values (use torch.where), or pass compile=False to skip the attempt",
        CompileWarning,
        stacklevel=4,
    )


def no_compiler(f: Callable[..., Any], device: torch.device) -> None:
    """The one warning for ``compile=True`` where ``compiler_available`` is False."""
    warn_once(
        f,
        "no compiler found for "
        + ("Triton (GPU)" if device.type == "cuda" else "C++ (set CXX or install g++)"),
    )


def forget() -> None:
    """Empty this process's caches of kernels, failures, disk misses and warnings (the
    kept kernels on disk stay)."""
    for cache in (CACHE, FAILED, BAD, ABSENT, _WARNED, SPAWNED, artifacts.UNTRUSTED):
        cache.clear()
