"""Every environment variable marquardt.jacobian reads, with its meaning.

``MARQUARDT_JACOBIAN_MODE``
    Forces the Jacobian mode of every engine built with ``mode="auto"``: a mode of the
    mode table (``vmap``, ``jacfwd``, ``layers``, ``broadcast``, ``taylor``). Unset: the planner
    chooses.
``MARQUARDT_JACOBIAN_MEMORY_BUDGET``
    Bytes of intermediate memory one device may use for one Jacobian chunk (the
    default ``memory_budget`` of an engine): the chunk's ``J_s`` plus its activations.
    Without a ``slice_size``, ``accumulate`` slices are capped at one chunk, and forward
    passes (loss, residuals) at this many bytes of activations, so the peak memory of a
    step does not grow with the batch. Unset: 256 MiB on CPU, half the free memory on a
    GPU (asked of CUDA only when a GPU is actually used, never at import).
``MARQUARDT_JACOBIAN_GRAM_KERNEL``
    The kernel that forms ``J_sᵀJ_s`` on CPU in the accumulate strategy: ``torch``,
    ``numpy``, ``numpy-threads`` or ``auto`` (default: a fixed rule on the shape and the
    torch thread count, ``_gram``).
``MARQUARDT_JACOBIAN_HOST_HEAP``
    ``keep`` (default) raises glibc's mmap and trim thresholds once, when an engine first
    computes on the CPU, so the host memory each step frees is reused by the next instead
    of being returned to the system and faulted in again (see ``_host_heap``);
    ``system`` leaves the process's ``malloc`` settings alone.

Nothing here is read at import time; each function reads the environment when called.
"""

from __future__ import annotations

import os

from marquardt.devices.messages import message

__all__ = [
    "ENV_GRAM_KERNEL",
    "ENV_HOST_HEAP",
    "ENV_MEMORY_BUDGET",
    "ENV_MODE",
    "gram_kernel",
    "host_heap",
    "memory_budget",
    "mode",
]

ENV_MODE = "MARQUARDT_JACOBIAN_MODE"
ENV_MEMORY_BUDGET = "MARQUARDT_JACOBIAN_MEMORY_BUDGET"
ENV_GRAM_KERNEL = "MARQUARDT_JACOBIAN_GRAM_KERNEL"
ENV_HOST_HEAP = "MARQUARDT_JACOBIAN_HOST_HEAP"

DEFAULT_CPU_BUDGET = 256 << 20


def mode() -> str | None:
    """The forced mode, or ``None`` when the planner chooses."""
    value = os.environ.get(ENV_MODE, "").strip().lower()
    return value or None


def memory_budget() -> int | None:
    """The memory budget in bytes from the environment, or ``None`` when unset."""
    value = os.environ.get(ENV_MEMORY_BUDGET, "").strip()
    if not value:
        return None
    try:
        budget = int(float(value))
    except ValueError as exc:
        raise ValueError(_budget_refused(value, "it is not a number")) from exc
    if budget <= 0:
        raise ValueError(_budget_refused(value, "it is not positive"))
    return budget


def _budget_refused(value: str, found: str) -> str:
    return message(
        f"{ENV_MEMORY_BUDGET}={value!r} was read as a memory budget in bytes",
        found,
        "give a positive number of bytes, e.g. 2e9, or unset it",
    )


def _one_of(name: str, default: str, allowed: tuple[str, ...], meaning: str) -> str:
    """The value of the environment variable ``name`` (``default`` when unset), refused
    unless one of ``allowed``; ``meaning`` says what it sets, for the message."""
    value = os.environ.get(name, default).strip().lower() or default
    if value not in allowed:
        known = ", ".join(allowed[:-1]) + f" and {allowed[-1]}"
        raise ValueError(
            message(
                f"{name}={value!r} was read as {meaning}",
                f"only {known} are understood",
                "set it to one of those, or unset it",
            )
        )
    return value


def gram_kernel() -> str:
    """``torch``, ``numpy``, ``numpy-threads`` or ``auto`` (the default)."""
    return _one_of(
        ENV_GRAM_KERNEL, "auto", ("auto", "torch", "numpy", "numpy-threads"), "the JᵀJ kernel"
    )


def host_heap() -> str:
    """``keep`` (the default) or ``system``."""
    return _one_of(ENV_HOST_HEAP, "keep", ("keep", "system"), "what to do with freed host memory")
