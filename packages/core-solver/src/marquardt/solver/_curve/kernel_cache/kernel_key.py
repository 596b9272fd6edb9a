"""What a compiled kernel of ``curve_fit_batch`` is specialised to: its key in the process
and on disk.

In the process a model's kernel is found by ``shapes``: f itself (or its id where f
cannot be hashed), the shapes, dtype, device and losses; a kernel of no model (the
attempt, the decision, the covariance: ``free_shapes``) by its kind, P, dtype, device
and what it is specialised to (tolerances, budget). The thread count is
not part of the key: a kernel is built for ``build_threads`` (what the default would pick
on an idle machine, never the load of the moment) and runs on those threads whatever the
call's own count, so that a change in the machine's load never asks for a second kernel. On disk
f's identity means nothing, so ``description`` puts in its place f's fingerprint
(``_curve.kernel_cache.fingerprint``), and adds (as ``free`` does for a kernel of no
model) the kernel's kind and fits, the SHA-256 of the
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
from ..batched_lm import normal, phases, state, traced, unrolled
from ..batched_lm.state import BatchData, BatchModel
from ..threads import BATCH_THREAD_WORK, choose_threads
from . import artifacts
from .fingerprint import fingerprint

__all__ = [
    "build_threads",
    "cpu",
    "description",
    "free",
    "free_shapes",
    "identity",
    "shapes",
    "solver_code",
]


def shapes(
    f: Callable[..., Any], p: torch.Tensor, data: BatchData, x_per_fit: bool
) -> tuple[Any, ...]:
    """What a model's compiled kernel (``traced.evaluation``) is specialised to, besides
    its number of fits."""
    return (
        identity(f),
        tuple(data.y.shape[1:]),
        tuple(data.x.shape[1:] if x_per_fit else data.x.shape),
        p.shape[1],
        x_per_fit,
        p.dtype,
        p.device,
        data.losses,
        data.w is not None,
        data.mask is not None,
    )


def free_shapes(kind: str, p: torch.Tensor, tests: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a kernel of no model (``kind``: "attempt", "decide" or "covariance") for fits
    of the parameters ``p`` (M × P) is specialised to, besides its number of fits: P,
    dtype, device and ``tests`` (the tolerances, budget or loss it bakes in)."""
    return (kind, None, p.shape[1], p.dtype, p.device, tests)


def build_threads(chunk_work: int, device: torch.device, most: int | None = None) -> int:
    """The torch threads a kernel is built for: the count the default would choose on an
    idle machine for a chunk of ``chunk_work`` elements of J (``_curve.threads``), so the
    same whatever the load (1 off the CPU, where it means nothing).

    **Arguments:** ``chunk_work``: fits per chunk × N × P; ``device``: where the fits run;
    ``most``: the most threads (default torch's setting).

    **Returns:** a thread count of at least 1.
    """
    if device.type != "cpu":
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    return choose_threads(chunk_work, BATCH_THREAD_WORK, most=most, machine=(cores, 0.0))


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
    return {
        "format": artifacts.FORMAT,
        "model": code,
        "name": getattr(f, "__qualname__", type(f).__name__),
        "kind": "evaluation",
        "shapes": repr(tuple(kernel_shapes[1:])),
        "fits": fits,
        "torch": torch.__version__,
        "solver": solver_code(type(model)),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpu(),
    }


def free(kernel_shapes: tuple[Any, ...], fits: int, device: torch.device) -> dict[str, Any]:
    """What a kept kernel of no model (the attempt, the decision, the covariance) is keyed
    by: ``kernel_shapes`` (``free_shapes``: its kind first, then None in the model's
    place) and the rest of ``description``'s parts."""
    return {
        "format": artifacts.FORMAT,
        "kind": kernel_shapes[0],
        "name": kernel_shapes[0],
        "shapes": repr(kernel_shapes[2:]),
        "fits": fits,
        "torch": torch.__version__,
        "solver": solver_code(None),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpu(),
    }


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
        modules = {normal, phases, state, traced, unrolled, _rules, robust}
        if model_type is not None:
            modules.add(sys.modules[model_type.__module__])
        for module in sorted(modules, key=lambda m: m.__name__):
            digest.update(Path(module.__file__ or "").read_bytes())
        _SOURCES[model_type] = digest.hexdigest()
    return _SOURCES[model_type]


_SOURCES: dict[type | None, str] = {}
