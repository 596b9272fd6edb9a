"""Assembling one step's undamped system from the Jacobian engine: :func:`assemble`.

Strategy "accumulate" has the model devices sum JᵀJ = Σ_s J_sᵀJ_s and Jᵀr = Σ_s J_sᵀr_s
and hands the P × P products to the backend; strategy "explicit" streams the slices J_s, r_s
into the backend, which forms JᵀJ/N (or JJᵀ/N when N < P, the under-determined form).
Either way the system is assembled once per step and reused by every damped attempt
(Marquardt 1963; Nielsen 1999). The seconds are split into Jacobian, transfer and assembly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ._backends.base import ArrayBackend, LinearSystem

if TYPE_CHECKING:
    from marquardt.jacobian import JacobianEngine

__all__ = ["Assembly", "assemble"]


@dataclass(frozen=True)
class Assembly:
    """The assembled system, the strategy that built it, and where its seconds went."""

    system: LinearSystem
    strategy: str
    seconds_jacobian: float
    seconds_transfer: float
    seconds_assembly: float


def _engine_seconds(engine: JacobianEngine) -> tuple[float, float, float]:
    """(jacobian, transfer, gram) seconds of the engine's last call."""
    timings: dict[str, float] = dict(getattr(engine, "timings", {}) or {})
    return (
        float(timings.get("jacobian", 0.0)),
        float(timings.get("transfer", 0.0)),
        float(timings.get("gram", 0.0)),
    )


def assemble(
    engine: JacobianEngine,
    backend: ArrayBackend,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    slice_size: int | None,
    *,
    strategy: str,
    dtype: torch.dtype | None,
    params: int,
) -> Assembly:
    """The system of this batch, by the strategy the Jacobian planner picks from ``strategy``
    ("auto": accumulate when N ≥ P); ``dtype`` is the accumulation dtype (None: the model's)."""
    plan = engine.plan(inputs, targets, slice_size, strategy=strategy)
    rows, chosen = int(plan.rows), str(plan.strategy)
    t0 = time.perf_counter()
    system: LinearSystem
    if chosen == "accumulate":
        products = engine.accumulate(inputs, targets, slice_size, dtype=dtype)
        system = backend.system_from_products(products)
    else:
        system = backend.system_from_slices(
            engine.slices(inputs, targets, slice_size), rows, params
        )
    backend.synchronize()
    elapsed = time.perf_counter() - t0
    # The engine reports per call: for "accumulate" its Jacobian time includes the
    # JᵀJ products ("gram"), which are assembly; for "explicit" the slices are
    # produced while the backend copies them, so the split is approximate.
    jacobian_s, transfer_s, gram_s = _engine_seconds(engine)
    seconds_jacobian = max(0.0, jacobian_s - gram_s - transfer_s)
    return Assembly(
        system=system,
        strategy=chosen,
        seconds_jacobian=seconds_jacobian,
        seconds_transfer=transfer_s,
        seconds_assembly=max(0.0, elapsed - seconds_jacobian - transfer_s),
    )
