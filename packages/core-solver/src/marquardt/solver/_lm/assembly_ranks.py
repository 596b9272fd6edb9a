"""The system of a global batch from the ranks' shares of it: `assemble_across_ranks`.

The rows of the global batch stack the ranks' rows, r = (r₀; r₁; …), J = (J₀; J₁; …), so:

* over-determined ("accumulate", N ≥ P): JᵀJ = Σₖ JₖᵀJₖ, Jᵀr = Σₖ Jₖᵀrₖ, ‖r‖² = Σₖ ‖rₖ‖²,
  N = Σₖ Nₖ: one all-reduce of P² + P + 2 numbers per step;
* under-determined ("explicit", N < P): JJᵀ has the cross blocks JᵢJⱼᵀ of every pair of
  ranks, so the row blocks (Nₖ × P) and residuals are all-gathered: every rank receives
  N × P numbers and builds the same N × N system (and δ = Jᵀu);
* matrix-free ("matrix_free", neither fits): Jᵀr, the diagonal probes Jᵀz, ‖r‖² and N
  are all-reduced once (P·(1 + probes) + 2 numbers), then every product JᵀJv of the
  conjugate gradients is all-reduced (P numbers per CG iteration); the probes' signs
  follow the global row index, so the ranks form the products one process would.

Every rank then solves the same system with the same λ. A rank that solved alone and
broadcast δ would make the others wait for the same factorisation and add one broadcast
of P numbers per attempt; solving on every rank costs no collective (CPU only where ranks
share cores). The all-reduced products are bitwise identical on every rank, so the ranks'
parameters stay bitwise identical on identical hardware.

A rank whose residuals are not finite sends NaN in place of its products or rows, and
every rank raises after the collective (``group/refusal.py``). Seconds are split by the
one rule of ``assembly.py`` (`timed`), the collectives' apart.
"""

from __future__ import annotations

import math
import time

import torch

from marquardt.jacobian import (
    JacobianEngine,
    JacobianSlice,
    NormalProducts,
    PreparedBatch,
    ResidualNotFiniteError,
)

from .._backends.base import ArrayBackend, LinearSystem
from .assembly import Assembly, SystemRequest, timed
from .group import (
    REFUSED,
    Collectives,
    not_finite_products,
    refused_elsewhere,
    summed_totals,
)
from .matrix_free import matrix_free_system

__all__ = ["assemble_across_ranks"]


def assemble_across_ranks(
    collectives: Collectives,
    engine: JacobianEngine,
    backend: ArrayBackend,
    batch: PreparedBatch,
    request: SystemRequest,
) -> Assembly:
    """The global system of this rank's share ``batch`` of a global batch.

    Arguments:
        collectives: this rank's collectives on its group.
        engine: the Jacobian engine of this rank's replicas.
        backend: the array backend that holds the system.
        batch: this rank's share, prepared with the global batch's strategy.
        request: the accumulation dtype, P, and the matrix-free step's probes.

    Returns:
        All-reduced products, or all-gathered row blocks, or (matrix free) all-reduced
        Jᵀr and probes with an operator whose every product is summed over the ranks.

    Raises:
        ResidualNotFiniteError: this rank's residuals, or another's, are not finite.
        RankFailureError: a collective failed.
    """
    if batch.strategy == "matrix_free":
        return _matrix_free(collectives, engine, batch, probes=request.probes, seed=request.seed)
    if batch.strategy == "accumulate":
        return _accumulated(collectives, engine, backend, batch, dtype=request.dtype)
    return _gathered(collectives, engine, backend, batch, params=request.params)


def _accumulated(
    collectives: Collectives,
    engine: JacobianEngine,
    backend: ArrayBackend,
    batch: PreparedBatch,
    *,
    dtype: torch.dtype | None,
) -> Assembly:
    t0 = time.perf_counter()
    failure: ResidualNotFiniteError | None = None
    try:
        local = engine.normal_products(batch, dtype=dtype)
    except ResidualNotFiniteError as exc:  # NaN goes to the others (group/refusal.py)
        failure, local = exc, not_finite_products(engine, batch, dtype)
    t1 = time.perf_counter()
    device = collectives.device
    jtj = local.jtj.to(device).contiguous()
    # Jᵀr, ‖r‖² and N in one float64 vector: the row count and the RSS exact.
    tail = torch.cat(
        [
            local.jtr.reshape(-1).to(device, torch.float64),
            torch.tensor([local.rss, float(local.rows)], dtype=torch.float64).to(device),
        ]
    )
    collectives.sum_(jtj, tail, what="all-reduce of JᵀJ, Jᵀr, ‖r‖² and N")
    t2 = time.perf_counter()
    home = local.jtj.device
    totals = summed_totals(tail, failure)
    products = NormalProducts(
        jtj=jtj.to(home),
        jtr=tail[:-2].to(home, local.jtr.dtype).reshape(local.jtr.shape),
        rss=float(totals[0]),
        rows=round(totals[1]),
    )
    system = backend.system_from_products(products)
    backend.synchronize()
    t3 = time.perf_counter()
    return timed(
        system,
        "accumulate",
        local.timings,
        t1 - t0,
        seconds_after=t3 - t2,
        seconds_collective=t2 - t1,
    )


def _matrix_free(
    collectives: Collectives,
    engine: JacobianEngine,
    batch: PreparedBatch,
    *,
    probes: int,
    seed: int,
) -> Assembly:
    t0 = time.perf_counter()
    rank, device = collectives.rank, collectives.device
    # This rank's first sample in the global batch: the probes' signs follow global rows.
    counts = torch.zeros(collectives.world_size, dtype=torch.float64, device=device)
    counts[rank] = float(batch.samples)
    counts = collectives.summed(counts, "sum of the sample counts")
    offset = round(float(counts[:rank].sum()))
    t1 = time.perf_counter()
    failure: ResidualNotFiniteError | None = None
    try:
        local = engine.gauss_newton(batch, probes=probes, seed=seed, row_offset=offset)
        jtr, jtz, rss = local.jtr, local.jtz, local.rss
    except ResidualNotFiniteError as exc:  # NaN goes to the others (group/refusal.py)
        failure, local = exc, None
        params = engine.replicas.num_params
        home = engine.replicas.devices[0]
        jtr = torch.full((params,), math.nan, dtype=torch.float64, device=home)
        jtz = torch.full((probes, params), math.nan, dtype=torch.float64, device=home)
        rss = math.nan
    t2 = time.perf_counter()
    home = jtr.device
    packed = torch.cat(
        [
            jtr.reshape(-1),
            jtz.reshape(-1),
            torch.tensor([rss, float(batch.rows)], dtype=torch.float64, device=home),
        ]
    ).to(device)
    collectives.sum_(packed, what="all-reduce of Jᵀr, Jᵀz, ‖r‖² and N")
    t3 = time.perf_counter()
    totals = summed_totals(packed, failure)
    assert local is not None
    params = jtr.numel()
    local.jtr = packed[:params].to(home)
    local.jtz = packed[params:-2].reshape(jtz.shape).to(home)
    local.rss = float(totals[0])
    local.rows = round(totals[1])

    def reduce(v: torch.Tensor) -> torch.Tensor:
        return collectives.summed(v, "all-reduce of a product JᵀJv")

    system = matrix_free_system(local, rows=local.rows, reduce=reduce)
    return timed(
        system,
        "matrix_free",
        local.timings,
        t2 - t1,
        seconds_after=time.perf_counter() - t3,
        seconds_collective=(t1 - t0) + (t3 - t2),
    )


def _gathered(
    collectives: Collectives,
    engine: JacobianEngine,
    backend: ArrayBackend,
    batch: PreparedBatch,
    *,
    params: int,
) -> Assembly:
    t0 = time.perf_counter()
    home = engine.replicas.devices[0]
    dtype = engine.replicas.dtype
    device = collectives.device
    jac = torch.empty(batch.rows, params, dtype=dtype, device=home)
    res = torch.empty(batch.rows, dtype=dtype, device=home)
    failure: ResidualNotFiniteError | None = None
    timings: dict[str, float] = {}
    try:
        timings = engine.fill_jacobian(batch, jac, res)
    except ResidualNotFiniteError as exc:  # NaN goes to the others (group/refusal.py)
        failure = exc
        res.fill_(float("nan"))
    t1 = time.perf_counter()
    mine = torch.tensor([batch.rows], dtype=torch.int64, device=device)
    counts = [int(s.item()) for s in collectives.gathered(mine, "all-gather of the row counts")]
    widest = max(counts)
    # Blocks of unequal height are padded to the tallest (all_gather wants one shape).
    block = torch.zeros(widest, params + 1, dtype=dtype, device=device)
    block[: batch.rows, :params] = jac.to(device)
    block[: batch.rows, params] = res.to(device)
    del jac, res
    blocks = collectives.gathered(block, "all-gather of the Jacobian row blocks")
    del block
    t2 = time.perf_counter()
    if failure is not None:
        raise failure
    if not all(
        bool(torch.isfinite(got[:count, params]).all())
        for count, got in zip(counts, blocks, strict=True)
    ):
        raise refused_elsewhere(REFUSED)
    rows = sum(counts)
    slices = []
    start = 0
    for count, got in zip(counts, blocks, strict=True):
        piece = got[:count].to(home)
        slices.append(
            JacobianSlice(
                start=start,
                stop=start + count,
                jacobian=piece[:, :params],
                residuals=piece[:, params].clone(),
            )
        )
        start += count
    del blocks
    system: LinearSystem = backend.system_from_slices(iter(slices), rows, params)
    backend.synchronize()
    t3 = time.perf_counter()
    return timed(
        system,
        "explicit",
        timings,
        t1 - t0,
        seconds_after=t3 - t2,
        seconds_collective=t2 - t1,
    )
