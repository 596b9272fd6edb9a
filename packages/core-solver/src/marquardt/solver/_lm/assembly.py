"""Assembling one step's undamped system from the Jacobian engine: `assemble`.

Strategy "accumulate" has the model devices sum JᵀJ = Σ_s J_sᵀJ_s and Jᵀr = Σ_s J_sᵀr_s
and hands the P × P products to the backend; strategy "explicit" streams the slices J_s, r_s
into the backend, which forms JᵀJ/N (or JJᵀ/N when N < P, the under-determined form);
strategy "matrix_free" forms no matrix: the engine's Jᵀr, diagonal probes and the
operator v ↦ JᵀJv/N make the system (``matrix_free``), solved by conjugate gradients.
Either way the system is assembled once per step, from a batch checked and planned once,
and reused by every damped attempt
(Marquardt 1963; Nielsen 1999). The seconds are split into Jacobian, transfer and assembly
by one rule, `timed` (also for the cross-rank assembly, ``assembly_ranks``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from marquardt.jacobian import JacobianEngine, PreparedBatch

from .._backends.base import ArrayBackend, JacobianBuffers, LinearSystem
from .matrix_free import matrix_free_system

__all__ = ["Assembly", "SystemRequest", "assemble", "timed"]


@dataclass(frozen=True)
class Assembly:
    """The assembled system, the strategy that built it, and where its seconds went."""

    system: LinearSystem
    strategy: str
    seconds_jacobian: float
    seconds_transfer: float
    seconds_assembly: float
    seconds_collective: float = 0.0


@dataclass(frozen=True)
class SystemRequest:
    """How a step's system is assembled: the accumulation dtype of JᵀJ (None: the
    model's), P (the system's columns), and the matrix-free step's diagonal probes and the
    seed of their signs (``JacobianEngine.gauss_newton``)."""

    dtype: torch.dtype | None
    params: int
    probes: int = 1
    seed: int = 0


def assemble(
    engine: JacobianEngine,
    backend: ArrayBackend,
    batch: PreparedBatch,
    request: SystemRequest,
) -> Assembly:
    """The system of a batch prepared by ``engine.prepare`` (its plan chose the strategy),
    as ``request`` asks.

    Explicit, a backend that offers `JacobianBuffers` gets J written straight into
    its arrays; any other backend receives the slices.
    """
    rows = batch.rows
    t0 = time.perf_counter()
    system: LinearSystem
    if batch.strategy == "matrix_free":
        gauss_newton = engine.gauss_newton(batch, probes=request.probes, seed=request.seed)
        system = matrix_free_system(gauss_newton, rows=rows)
        return timed(system, "matrix_free", gauss_newton.timings, time.perf_counter() - t0)
    if batch.strategy == "accumulate":
        products = engine.normal_products(batch, dtype=request.dtype)
        timings = products.timings
        system = backend.system_from_products(products)
    elif isinstance(backend, JacobianBuffers):
        jac, res = backend.jacobian_buffers(rows, request.params, engine.replicas.dtype)
        timings = engine.fill_jacobian(batch, jac, res)
        system = backend.system_from_jacobian(jac, res)
    else:
        stream = engine.jacobian_slices(batch)
        system = backend.system_from_slices(stream, rows, request.params)
        timings = stream.timings
    backend.synchronize()
    return timed(system, batch.strategy, timings, time.perf_counter() - t0)


def timed(
    system: LinearSystem,
    strategy: str,
    timings: Mapping[str, float],
    seconds: float,
    *,
    seconds_after: float = 0.0,
    seconds_collective: float = 0.0,
) -> Assembly:
    """An `Assembly` with its seconds split into Jacobian, transfer and assembly.

    Arguments:
        system: the assembled system.
        strategy: the strategy that built it.
        timings: the engine's own split of its seconds: ``jacobian`` (everything it did,
            the Gram products JᵀJ included), ``gram`` and ``transfer`` (each 0 when
            absent; ``jacobian`` absent, as when a rank's residuals were not finite:
            ``seconds``).
        seconds: the wall-clock seconds from the engine's first call to the system built
            (on this rank, before any collective).
        seconds_after: seconds spent building the system after the collectives.
        seconds_collective: seconds spent in collectives.

    Returns:
        The Jacobian's seconds are the engine's less its Gram products (assembly) and its
        transfers; assembly is what remains of ``seconds``, plus ``seconds_after``. For
        streamed slices the backend copies them while they are produced, so the split is
        approximate.
    """
    transfer = timings.get("transfer", 0.0)
    jacobian = max(0.0, timings.get("jacobian", seconds) - timings.get("gram", 0.0) - transfer)
    return Assembly(
        system=system,
        strategy=strategy,
        seconds_jacobian=jacobian,
        seconds_transfer=transfer,
        seconds_assembly=max(0.0, seconds - jacobian - transfer) + seconds_after,
        seconds_collective=seconds_collective,
    )
