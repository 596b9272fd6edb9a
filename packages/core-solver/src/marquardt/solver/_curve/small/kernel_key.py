"""What a compiled kernel of ``curve_fit_batch`` is specialised to: its key in the process
and on disk.

In the process a kernel is found by ``shapes``: f itself (or its id where f cannot be
hashed), the shapes, dtype, device, thread count, losses, tolerances and budget. On disk
f's identity means nothing, so ``description`` puts in its place f's fingerprint
(``_curve.small.fingerprint``), and adds the kernel's kind and fits, the SHA-256 of the
solver's own modules whose code the graph runs, torch's version, the GPU's name and the
processor's instruction sets.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ... import _rules
from ..._lm import robust
from . import artifacts, batched, normal, traced, unrolled
from .batched import BatchData, BatchModel
from .fingerprint import fingerprint

__all__ = [
    "covariance",
    "cpu",
    "description",
    "identity",
    "other_threads",
    "shapes",
    "solver_code",
]


def shapes(
    f: Callable[..., Any],
    p: torch.Tensor,
    data: BatchData,
    tol: dict[str, float],
    max_nfev: int,
    x_per_fit: bool,
) -> tuple[Any, ...]:
    """What a compiled iteration is specialised to, besides its number of fits."""
    return (
        identity(f),
        tuple(data.y.shape[1:]),
        tuple(data.x.shape[1:] if x_per_fit else data.x.shape),
        p.shape[1],
        x_per_fit,
        p.dtype,
        p.device,
        torch.get_num_threads(),
        data.losses,
        data.w is not None,
        data.mask is not None,
        tuple(sorted(tol.items())),
        max_nfev,
    )


#: Where ``shapes`` puts the thread count.
_THREADS = 7


def identity(f: Callable[..., Any]) -> Any:
    """f, or its id where f cannot be hashed."""
    try:
        hash(f)
    except TypeError:
        return id(f)
    return f


def description(
    f: Callable[..., Any],
    kernel_shapes: tuple[Any, ...],
    fits: int,
    model: BatchModel,
    device: torch.device,
) -> dict[str, Any] | None:
    """What a kept kernel's key is made of, or None where f has no fingerprint:
    ``kernel_shapes`` (from ``shapes``) less f's identity in this process, which the
    fingerprint stands for."""
    code = fingerprint(f)
    if code is None:
        return None
    start = isinstance(kernel_shapes[0], str)
    rest = list(kernel_shapes[2:] if start else kernel_shapes[1:])
    threads = rest.pop(_THREADS - 1)
    return {
        "format": artifacts.FORMAT,
        "model": code,
        "name": getattr(f, "__qualname__", type(f).__name__),
        "kind": "start" if start else "iteration",
        "shapes": repr(tuple(rest)),
        "threads": threads,
        "fits": fits,
        "torch": torch.__version__,
        "solver": solver_code(type(model)),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpu(),
    }


def covariance(kernel_shapes: tuple[Any, ...], fits: int, device: torch.device) -> dict[str, Any]:
    """What a kept kernel of ``traced.gram_inverse`` is keyed by: no model (it has none),
    ``kernel_shapes`` ("covariance", None, P, P, dtype, device, threads) and the rest of
    ``description``'s parts."""
    return {
        "format": artifacts.FORMAT,
        "kind": "covariance",
        "name": "covariance",
        "shapes": repr(kernel_shapes[2:-1]),
        "threads": kernel_shapes[-1],
        "fits": fits,
        "torch": torch.__version__,
        "solver": solver_code(None),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpu(),
    }


def other_threads(described: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """``described`` for the fewer threads a kernel may have been kept for here (one, or
    half the cores; on the CPU only), most first: where no kernel may be compiled, one kept
    for fewer threads computes the same and runs faster than the eager iteration, and
    never takes more threads than the call was given."""
    if device.type != "cpu":
        return []
    counts = {1, (os.cpu_count() or 1) // 2, described["threads"] - 1}
    mine = described["threads"]
    return [{**described, "threads": n} for n in sorted(counts, reverse=True) if 0 < n < mine]


@functools.cache
def cpu() -> str:
    """The processor: its architecture and, on Linux, the SHA-256 of its model name and
    instruction-set flags (a kernel built for one ISA may not run on another)."""
    digest = hashlib.sha256(platform.machine().encode())
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    for line in text.splitlines():
        if line.startswith(("model name", "flags", "Features", "CPU part")):
            digest.update(line.encode())
        elif not line.strip():
            break  # the first processor is enough
    return digest.hexdigest()[:24]


def solver_code(model_type: type | None) -> str:
    """The SHA-256 of the source of every module whose code the traced graph runs (the
    model class's module too, where there is one)."""
    if model_type not in _SOURCES:
        digest = hashlib.sha256()
        modules = {batched, normal, traced, unrolled, _rules, robust}
        if model_type is not None:
            modules.add(sys.modules[model_type.__module__])
        for module in sorted(modules, key=lambda m: m.__name__):
            digest.update(Path(module.__file__ or "").read_bytes())
        _SOURCES[model_type] = digest.hexdigest()
    return _SOURCES[model_type]


_SOURCES: dict[type | None, str] = {}
