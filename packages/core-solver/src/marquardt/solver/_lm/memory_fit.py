"""Whether one step fits the solver's memory, checked before any Jacobian is formed.

The step of a plan (``marquardt.jacobian.JacobianPlan``: ``R`` rows, ``S`` columns, ``P``
parameters, ``b`` bytes per element) holds, besides the chunks of ``J`` the engine forms
(``plan.chunk_bytes`` per model device):

* ``θ``, its backup and the step δ scattered into ``P`` float64: ``P·(2b + 8)``;
* accumulate: ``3·8·S²`` (the accumulated ``JᵀJ`` in float64, the matrix the backend
  factorises and its damped copy), as ``marquardt.devices.plan`` counts it;
* explicit: ``J`` whole, ``R·S·b``, and ``2·8·min(R, S)²`` for the normal matrix and its
  damped copy;
* matrix_free: no matrix, ``8·S·(CG_VECTORS + probes + SKETCH_VECTORS·rank)`` for the
  conjugate gradients' vectors, the diagonal probes and the Nyström sketch of rank ``rank``
  (``_lm/matrix_free.py``): linear in ``P``.

The usable memory is ``memory_limit`` when given, else 0.8 × the free memory of the
solver's device (``marquardt.devices.device_memory``: the driver's free memory plus what
torch's caching allocator holds unused) or of the host (``MemAvailable``). A step
that does not fit is never started: with ``strategy="auto"`` and no ``params_per_step`` the
solver switches to parameter subsets of the largest ``k`` that fits
(``marquardt.devices.subset_size``); a forced strategy or ``params_per_step`` that does
not fit is refused with the figures and the ``k`` that would fit. With the cuPyNumeric
backend Legate holds the system on its own GPUs: the check is left to
``marquardt-devices`` (its plan sizes Legate), and not made here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from marquardt.devices import device_memory, subset_size
from marquardt.devices._whole import require_whole
from marquardt.jacobian import JacobianPlan

from .._errors import SolverConfigError, message
from .solve.cg import CG_VECTORS, SKETCH_VECTORS

__all__ = ["HEADROOM", "StepMemory", "check_limit", "step_memory", "usable_memory"]

#: The fraction of the free memory a step leaves untouched.
HEADROOM = 0.2


def _fmt(nbytes: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} B"


@dataclass(frozen=True)
class StepMemory:
    """The bytes a step needs (``needed``, ``formula``) and may use (``usable``, ``source``),
    and the subset size that would fit (``fitting_k``)."""

    needed: int
    usable: int
    formula: str
    source: str
    fitting_k: int

    @property
    def fits(self) -> bool:
        """Whether the step fits."""
        return self.needed <= self.usable

    def refuse(self, what: str) -> SolverConfigError:
        """The error for a forced ``what`` that does not fit."""
        fix = (
            f"pass params_per_step={self.fitting_k} (the largest subset that fits), or leave "
            "strategy='auto' and params_per_step=None to let the planner choose"
            if self.fitting_k >= 1
            else "free memory or use a device with more of it: not even a subset of one "
            "parameter fits next to θ"
        )
        return SolverConfigError(
            message(
                f"an LM step with {what} was requested",
                f"it needs {self.formula} = {_fmt(self.needed)} but {_fmt(self.usable)} are "
                f"usable ({self.source})",
                fix,
            )
        )


def check_limit(limit: object) -> None:
    """Refuse a ``memory_limit`` that is not a positive whole number of bytes."""
    if limit is not None:
        require_whole(
            limit,
            1,
            SolverConfigError,
            "memory_limit was expected as a positive number of bytes",
            "pass e.g. memory_limit=8 << 30, or None for the device's free memory",
        )


def usable_memory(device: torch.device, limit: int | None) -> tuple[int, str]:
    """Bytes a step may use on ``device`` (the solver's), and where the figure comes from."""
    if limit is not None:
        return limit, f"memory_limit={limit}"
    found = device_memory(device)
    return int(found.available * (1 - HEADROOM)), f"{found.source} x {1 - HEADROOM:.1f}"


def step_memory(
    plan: JacobianPlan,
    params: int,
    item: int,
    devices: int,
    usable: tuple[int, str],
    *,
    probes: int = 1,
    rank: int = 0,
) -> StepMemory:
    """What the step of ``plan`` needs against ``usable`` (see the module docstring);
    ``probes`` and ``rank`` count for a matrix-free plan only."""
    cols, rows = plan.params, plan.rows
    fixed = params * (2 * item + 8)
    chunks = plan.chunk_bytes * devices
    if plan.strategy == "accumulate":
        system = 24 * cols * cols
        words = f"3 x 8 x {cols}^2 (the system)"
    elif plan.strategy == "matrix_free":
        vectors = CG_VECTORS + probes + SKETCH_VECTORS * rank
        system = 8 * cols * vectors
        words = f"8 x {cols} x {vectors} (CG vectors, diagonal probes, sketch)"
    else:
        side = min(rows, cols)
        system = rows * cols * item + 16 * side * side
        words = f"{rows} x {cols} x {item} (J) + 2 x 8 x {side}^2 (the system)"
    formula = (
        f"{words} + {params} x {2 * item + 8} (θ, backup, δ) + {devices} x "
        f"{_fmt(plan.chunk_bytes)} (Jacobian chunks)"
    )
    k = subset_size(usable[0] - chunks, params, item)
    return StepMemory(system + fixed + chunks, usable[0], formula, usable[1], k)
