"""One LM step shared by the ranks of a torch.distributed process group.

The residual vector of a global batch stacks the ranks' local residuals, r = (r₀; r₁; …),
and its Jacobian stacks their row blocks J = (J₀; J₁; …), so the damped normal equations
of Levenberg (1944) and Marquardt (1963) (see ``_lma``) are sums over ranks:

* over-determined ("accumulate", N ≥ P): JᵀJ = Σₖ JₖᵀJₖ, Jᵀr = Σₖ Jₖᵀrₖ, ‖r‖² = Σₖ ‖rₖ‖²,
  N = Σₖ Nₖ — one all-reduce of P² + P + 2 numbers per step;
* under-determined ("explicit", N < P): JJᵀ has the cross blocks JᵢJⱼᵀ of every pair of
  ranks, so the row blocks (Nₖ × P) and residuals are all-gathered: every rank receives
  N × P numbers and builds the same N × N system (and δ = Jᵀu);
* matrix-free ("matrix_free", neither fits): Jᵀr, the diagonal probes Jᵀz, ‖r‖² and N
  are all-reduced once (P·(1 + probes) + 2 numbers), then every product JᵀJv of the
  conjugate gradients is all-reduced (P numbers per CG iteration); the probes' signs
  follow the global row index, so the ranks form the products one process would;
* the loss of every trial point is Σₖ ‖rₖ‖² / Σₖ Nₖ (a custom ``loss_fn``: Σₖ Lₖ·nₖ / Σₖ nₖ
  over samples, as one process weighs its slices), all-reduced as two numbers, so the
  ranks take the same accept / reject decision (Nielsen 1999) and λ stays identical.

A rank whose data or residuals are not finite still takes its part in the step's
collectives up to the next one that can carry the news (the memory plan's, with a flag,
when the data check or planning found them; else the products', with NaN in place of its
products or rows), and then raises ``BatchNotFiniteError`` or ``ResidualNotFiniteError``;
every other rank learns of it through that collective and raises
``ResidualNotFiniteError``: the ranks refuse the batch together, with no collective left
waiting.

Every rank then solves the same system with the same λ. A rank that solves alone and
broadcasts δ makes the others wait for the same factorisation and adds one broadcast of
P numbers per attempt; solving on every rank costs no collective, which is why it is done
here (``benchmarks/bench_distributed.py`` times the broadcast it saves). It costs CPU only
where ranks share cores (several ranks on one machine). The all-reduced products are
bitwise identical on every rank, so the ranks' parameters stay bitwise identical on
identical hardware; ``MARQUARDT_SOLVER_CHECK_RANKS=1`` checks that after every step.

Collectives are torch.distributed's (gloo on CPUs, NCCL on GPUs); nothing is home-made.
A collective that fails (a peer died, hung past the group's timeout, or raised before
reaching it) raises `RankFailureError` naming the rank that saw it, the
collective, the step and, where the rendezvous store still answers, the ranks that did
not answer a roll call.

`LocalScope` is the one-process step (no collective); `GroupScope` the
process-group one; ``LMA`` holds one of them (`step_scope`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from marquardt.jacobian import (
    ColumnSubset,
    JacobianEngine,
    JacobianSlice,
    NormalProducts,
    PreparedBatch,
    Replicas,
    ResidualNotFiniteError,
)

from .._backends.base import ArrayBackend, LinearSystem
from .._errors import SolverConfigError, message
from .._settings import check_ranks
from .assembly import Assembly, assemble
from .matrix_free import matrix_free_system
from .report import StepReport

__all__ = [
    "DEFAULT_GROUP",
    "REFUSED",
    "GroupScope",
    "LocalScope",
    "RankFailureError",
    "RanksDisagreeError",
    "StepScope",
    "refused_elsewhere",
    "step_scope",
]

#: What a rank says when another refused its share of the batch.
REFUSED = "another rank's data or residuals are NaN or infinite: it refused its part of the batch"

#: ``LMA(process_group=DEFAULT_GROUP)``: torch.distributed's default (world) group.
DEFAULT_GROUP = "default"

#: Seconds a failing rank waits for the others' answers to its roll call.
ROLL_CALL_SECONDS = 2.0


class RankFailureError(RuntimeError):
    """A collective of an LM step failed: a peer rank died, hung or raised before it."""


class RanksDisagreeError(RuntimeError):
    """The ranks of a process group ended an LM step in different states (debug check)."""


class StepScope(Protocol):
    """Where the products of one step come from: this process alone, or a process group."""

    world_size: int

    def sync_parameters(self, replicas: Replicas) -> None:
        """Make every rank start from the same θ."""
        ...

    def prepare(
        self,
        engine: JacobianEngine,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None,
        strategy: str,
        *,
        columns: ColumnSubset | None = None,
    ) -> PreparedBatch:
        """The local batch, planned with the strategy the *global* batch needs."""
        ...

    def assemble(
        self,
        engine: JacobianEngine,
        backend: ArrayBackend,
        batch: PreparedBatch,
        *,
        dtype: torch.dtype | None,
        params: int,
        probes: int = 1,
        seed: int = 0,
    ) -> Assembly:
        """The global system of the step (``probes``, ``seed``: the matrix-free step's)."""
        ...

    def mean_loss(self, loss: torch.Tensor, batch: PreparedBatch, *, custom: bool) -> torch.Tensor:
        """The global loss from this rank's loss on its batch."""
        ...

    def common_seed(self, seed: int | None) -> int | None:
        """The seed every rank draws parameter subsets from (rank 0's)."""
        ...

    def least(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """The smallest of each value over the ranks (a memory plan all ranks can take)."""
        ...

    def refuse(self, strategy: str) -> None:
        """Take part in the step this rank refused before planning (see ``GroupScope``)."""
        ...

    def finish(self, report: StepReport, replicas: Replicas) -> None:
        """Called once per step, after the attempts."""
        ...


class LocalScope:
    """The one-process step: the batch is the whole batch, nothing crosses a network."""

    world_size = 1

    def sync_parameters(self, replicas: Replicas) -> None:
        """Nothing to synchronise."""

    def prepare(
        self,
        engine: JacobianEngine,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None,
        strategy: str,
        *,
        columns: ColumnSubset | None = None,
    ) -> PreparedBatch:
        return engine.prepare(
            inputs, targets, slice_size, strategy=strategy, checked=True, columns=columns
        )

    def assemble(
        self,
        engine: JacobianEngine,
        backend: ArrayBackend,
        batch: PreparedBatch,
        *,
        dtype: torch.dtype | None,
        params: int,
        probes: int = 1,
        seed: int = 0,
    ) -> Assembly:
        return assemble(
            engine, backend, batch, dtype=dtype, params=params, probes=probes, seed=seed
        )

    def mean_loss(self, loss: torch.Tensor, batch: PreparedBatch, *, custom: bool) -> torch.Tensor:
        return loss

    def common_seed(self, seed: int | None) -> int | None:
        return seed

    def least(self, values: tuple[int, ...]) -> tuple[int, ...]:
        return values

    def refuse(self, strategy: str) -> None:
        """Nothing to tell."""

    def finish(self, report: StepReport, replicas: Replicas) -> None:
        """Nothing to check."""


def _group_backend(group: Any) -> str:
    return str(dist.get_backend(group)).lower()


@dataclass
class GroupScope:
    """The step of one rank of ``group``: local products, combined by collectives.

    ``group`` None is torch.distributed's default group, looked up at every collective
    rather than held: a reference kept in an LMA would keep the group alive past
    ``destroy_process_group`` until the interpreter's own teardown, where gloo's threads
    abort the process. ``device`` is where the collectives' tensors live (the CPU for gloo, the model's GPU
    for NCCL); ``check`` turns on the after-step agreement check.
    """

    group: Any
    device: torch.device
    check: bool = False
    rank: int = field(init=False)
    world_size: int = field(init=False)
    _step: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)

    # -- failures ----------------------------------------------------------------------
    @contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        """Turn a failed collective into a `RankFailureError` that names ranks."""
        try:
            yield
        except RuntimeError as err:
            if isinstance(err, RankFailureError | RanksDisagreeError):
                raise
            absent = self._roll_call()
            raise RankFailureError(
                message(
                    f"rank {self.rank} of {self.world_size} was in the {what} of LM step "
                    f"{self._step + 1}",
                    f"the collective failed ({type(err).__name__}: {str(err).strip()[:300]}); "
                    f"{absent}",
                    "a peer rank died, raised before the collective or hung past the process "
                    "group's timeout: read that rank's own error; every rank must call "
                    "LMA.step the same number of times with a non-empty share of the batch",
                )
            ) from err

    def _roll_call(self) -> str:
        """Which ranks answer through the rendezvous store within ``ROLL_CALL_SECONDS``."""
        try:
            store = dist.distributed_c10d._get_default_store()
            previous = store.timeout  # type: ignore[attr-defined]
            store.set_timeout(timedelta(seconds=ROLL_CALL_SECONDS))
            prefix = f"marquardt/lma/roll-call/{self._step}/"
            try:
                store.set(f"{prefix}{self.rank}", "alive")
                deadline = time.monotonic() + ROLL_CALL_SECONDS
                missing = list(range(self.world_size))
                while missing and time.monotonic() < deadline:
                    missing = [r for r in missing if not store.check([f"{prefix}{r}"])]
                    if missing:
                        time.sleep(0.1)
            finally:
                store.set_timeout(previous)
        except Exception as err:  # the store may have died with a rank
            return (
                "the rendezvous store did not answer either, so the rank that died is "
                f"unknown (it may have served the store, as rank 0 does with init_method "
                f"tcp:// or env://): {type(err).__name__}"
            )
        if not missing:
            return "every rank answered the roll call afterwards"
        names = ", ".join(str(r) for r in missing)
        return f"rank(s) {names} did not answer a roll call within {ROLL_CALL_SECONDS:g} s"

    # -- collectives -------------------------------------------------------------------
    def _all_reduce(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """The sum over ranks of ``tensor`` (any device), on ``tensor``'s device."""
        buf = tensor.to(self.device).contiguous()
        with self._collective(what):
            dist.all_reduce(buf, group=self.group)
        return buf.to(tensor.device)

    def _source(self) -> int:
        """The global rank of the group's rank 0."""
        return 0 if self.group is None else dist.get_global_rank(self.group, 0)

    def common_seed(self, seed: int | None) -> int | None:
        """Rank 0's seed on every rank (drawn there when None), so that random parameter
        subsets select the same columns on every rank."""
        if seed is None and self.rank == 0:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        value = torch.tensor([0 if seed is None else seed], dtype=torch.int64, device=self.device)
        with self._collective("broadcast of the subset seed"):
            dist.broadcast(value, src=self._source(), group=self.group)
        return int(value.item())

    def refuse(self, strategy: str) -> None:
        """This rank's part in a step whose batch it refused before planning it (data or
        residuals not finite): the collectives the others make until they learn of it,
        the row count (``strategy="auto"``) and the memory plan's minimum, with its flag
        down; ``LMA._fits`` then raises on every other rank."""
        if strategy == "auto":
            self._all_reduce(torch.zeros(1, dtype=torch.float64), "sum of the row counts")
        self.least((1, 0, 0))

    def least(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """The smallest of each value over the ranks."""
        buf = torch.tensor(values, dtype=torch.int64, device=self.device)
        with self._collective("minimum of the memory plans"):
            dist.all_reduce(buf, op=dist.ReduceOp.MIN, group=self.group)
        return tuple(int(v) for v in buf.tolist())

    def sync_parameters(self, replicas: Replicas) -> None:
        """θ of the group's rank 0 on every rank (as DDP does when it wraps a model)."""
        flat = replicas.flat_params().to(self.device)
        with self._collective("broadcast of the parameters"):
            dist.broadcast(flat, src=self._source(), group=self.group)
        replicas.set_flat_params(flat)

    def prepare(
        self,
        engine: JacobianEngine,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None,
        strategy: str,
        *,
        columns: ColumnSubset | None = None,
    ) -> PreparedBatch:
        """The local batch; with ``strategy="auto"`` the global N decides (N ≥ P: accumulate)."""
        batch = engine.prepare(
            inputs, targets, slice_size, strategy=strategy, checked=True, columns=columns
        )
        if strategy != "auto":
            return batch
        rows = self._all_reduce(
            torch.tensor([float(batch.rows)], dtype=torch.float64), "sum of the row counts"
        )
        wanted = "accumulate" if int(rows[0]) >= batch.params else "explicit"
        if wanted == batch.strategy:
            return batch
        return engine.prepare(
            inputs, targets, slice_size, strategy=wanted, checked=True, columns=columns
        )

    def assemble(
        self,
        engine: JacobianEngine,
        backend: ArrayBackend,
        batch: PreparedBatch,
        *,
        dtype: torch.dtype | None,
        params: int,
        probes: int = 1,
        seed: int = 0,
    ) -> Assembly:
        """The global system: all-reduced products, or all-gathered row blocks, or (matrix
        free) all-reduced Jᵀr and probes with an operator whose every product is summed."""
        if batch.strategy == "matrix_free":
            return self._matrix_free(engine, batch, probes=probes, seed=seed)
        if batch.strategy == "accumulate":
            return self._accumulated(engine, backend, batch, dtype=dtype)
        return self._gathered(engine, backend, batch, params=params)

    def _accumulated(
        self,
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
        except ResidualNotFiniteError as exc:  # NaN goes to the others (module docstring)
            failure, local = exc, _not_finite_products(engine, batch, dtype)
        t1 = time.perf_counter()
        jtj = local.jtj.to(self.device).contiguous()
        # Jᵀr, ‖r‖² and N in one float64 vector: the row count and the RSS exact.
        tail = torch.cat(
            [
                local.jtr.reshape(-1).to(self.device, torch.float64),
                torch.tensor([local.rss, float(local.rows)], dtype=torch.float64).to(self.device),
            ]
        )
        with self._collective("all-reduce of JᵀJ, Jᵀr, ‖r‖² and N"):
            dist.all_reduce(jtj, group=self.group)
            dist.all_reduce(tail, group=self.group)
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
        timings = local.timings
        gram = timings.get("gram", 0.0)
        transfer = timings.get("transfer", 0.0)
        seconds_jacobian = max(0.0, timings.get("jacobian", t1 - t0) - gram - transfer)
        return Assembly(
            system=system,
            strategy="accumulate",
            seconds_jacobian=seconds_jacobian,
            seconds_transfer=transfer,
            seconds_assembly=max(0.0, (t1 - t0) - seconds_jacobian - transfer) + (t3 - t2),
            seconds_collective=t2 - t1,
        )

    def _matrix_free(
        self, engine: JacobianEngine, batch: PreparedBatch, *, probes: int, seed: int
    ) -> Assembly:
        t0 = time.perf_counter()
        # This rank's first sample in the global batch: the probes' signs follow global rows.
        counts = torch.zeros(self.world_size, dtype=torch.float64, device=self.device)
        counts[self.rank] = float(batch.samples)
        counts = self._all_reduce(counts, "sum of the sample counts")
        offset = round(float(counts[: self.rank].sum()))
        t1 = time.perf_counter()
        failure: ResidualNotFiniteError | None = None
        try:
            local = engine.gauss_newton(batch, probes=probes, seed=seed, row_offset=offset)
            jtr, jtz, rss = local.jtr, local.jtz, local.rss
        except ResidualNotFiniteError as exc:  # NaN goes to the others (module docstring)
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
        ).to(self.device)
        with self._collective("all-reduce of Jᵀr, Jᵀz, ‖r‖² and N"):
            dist.all_reduce(packed, group=self.group)
        t3 = time.perf_counter()
        totals = summed_totals(packed, failure)
        assert local is not None
        params = jtr.numel()
        local.jtr = packed[:params].to(home)
        local.jtz = packed[params:-2].reshape(jtz.shape).to(home)
        local.rss = float(totals[0])
        local.rows = round(totals[1])

        def reduce(v: torch.Tensor) -> torch.Tensor:
            out = v.to(self.device)
            with self._collective("all-reduce of a product JᵀJv"):
                dist.all_reduce(out, group=self.group)
            return out.to(v.device)

        system = matrix_free_system(local, rows=local.rows, reduce=reduce)
        return Assembly(
            system=system,
            strategy="matrix_free",
            seconds_jacobian=t2 - t1,
            seconds_transfer=0.0,
            seconds_assembly=time.perf_counter() - t3,
            seconds_collective=(t1 - t0) + (t3 - t2),
        )

    def _gathered(
        self, engine: JacobianEngine, backend: ArrayBackend, batch: PreparedBatch, *, params: int
    ) -> Assembly:
        t0 = time.perf_counter()
        home = engine.replicas.devices[0]
        dtype = engine.replicas.dtype
        jac = torch.empty(batch.rows, params, dtype=dtype, device=home)
        res = torch.empty(batch.rows, dtype=dtype, device=home)
        failure: ResidualNotFiniteError | None = None
        try:
            timings = engine.fill_jacobian(batch, jac, res)
        except ResidualNotFiniteError as exc:  # NaN goes to the others (module docstring)
            failure, timings = exc, {}
            res.fill_(float("nan"))
        t1 = time.perf_counter()
        sizes = [
            torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world_size)
        ]
        mine = torch.tensor([batch.rows], dtype=torch.int64, device=self.device)
        with self._collective("all-gather of the row counts"):
            dist.all_gather(sizes, mine, group=self.group)
        counts = [int(s.item()) for s in sizes]
        widest = max(counts)
        # Blocks of unequal height are padded to the tallest (all_gather wants one shape).
        block = torch.zeros(widest, params + 1, dtype=dtype, device=self.device)
        block[: batch.rows, :params] = jac.to(self.device)
        block[: batch.rows, params] = res.to(self.device)
        del jac, res
        blocks = [torch.empty_like(block) for _ in range(self.world_size)]
        with self._collective("all-gather of the Jacobian row blocks"):
            dist.all_gather(blocks, block, group=self.group)
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
        transfer = timings.get("transfer", 0.0)
        seconds_jacobian = max(0.0, timings.get("jacobian", t1 - t0) - transfer)
        return Assembly(
            system=system,
            strategy="explicit",
            seconds_jacobian=seconds_jacobian,
            seconds_transfer=transfer,
            seconds_assembly=max(0.0, (t1 - t0) - seconds_jacobian - transfer) + (t3 - t2),
            seconds_collective=t2 - t1,
        )

    def mean_loss(self, loss: torch.Tensor, batch: PreparedBatch, *, custom: bool) -> torch.Tensor:
        """Σₖ Lₖwₖ / Σₖ wₖ with wₖ this rank's rows (mean of squares) or samples (custom)."""
        weight = float(batch.samples if custom else batch.rows)
        pair = torch.stack(
            [
                loss.to(torch.float64) * weight,
                torch.tensor(weight, dtype=torch.float64).to(loss.device),
            ]
        )
        total = self._all_reduce(pair, "all-reduce of the trial loss")
        return total[0] / total[1]

    def finish(self, report: StepReport, replicas: Replicas) -> None:
        """Count the step; with ``check``, compare λ, attempts, acceptance, ‖δ‖, the loss
        and Σθ across ranks, bitwise, and raise `RanksDisagreeError` on a mismatch."""
        self._step += 1
        if not self.check:
            return
        mine = torch.tensor(
            [
                report.damping,
                float(report.attempts),
                float(report.accepted),
                report.step_norm,
                report.loss_after,
                float(replicas.flat_params().double().sum()),
            ],
            dtype=torch.float64,
            device=self.device,
        )
        everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
        with self._collective("all-gather of the agreement check"):
            dist.all_gather(everyone, mine, group=self.group)
        names = ("λ", "attempts", "accepted", "‖lr·δ‖", "loss", "Σθ")
        reference = everyone[0].tolist()
        differ: list[str] = []
        for rank, values in enumerate(everyone):
            got = values.tolist()
            for name, a, b in zip(names, reference, got, strict=True):
                same = a == b or (a != a and b != b)  # NaN agrees with NaN
                if not same:
                    differ.append(f"rank {rank} has {name} = {b!r} where rank 0 has {a!r}")
        if differ:
            raise RanksDisagreeError(
                message(
                    f"the ranks of the process group were to end LM step {self._step} in the "
                    "same state (MARQUARDT_SOLVER_CHECK_RANKS)",
                    "; ".join(differ),
                    "every rank must build the LMA with the same options and call step() "
                    "the same number of times; different hardware or BLAS on different "
                    "nodes can make identical solves differ in the last bits",
                )
            )


def step_scope(process_group: object, devices: list[torch.device]) -> StepScope:
    """The scope for ``LMA(process_group=...)``: None is one process (see ``LMA``)."""
    if process_group is None:
        return LocalScope()
    if not dist.is_available():
        raise SolverConfigError(
            message(
                "LMA(process_group=...) was asked to share each step over a process group",
                "this torch build has no torch.distributed",
                "install a torch wheel with distributed support, or pass process_group=None",
            )
        )
    if isinstance(process_group, str):
        if process_group != DEFAULT_GROUP:
            raise SolverConfigError(
                message(
                    f"LMA(process_group={process_group!r}) was asked for a process group",
                    "the only name accepted is 'default' (torch.distributed's world group)",
                    "pass 'default', a torch.distributed.ProcessGroup, or None",
                )
            )
        if not dist.is_initialized():
            raise SolverConfigError(
                message(
                    "LMA(process_group='default') was asked to use the default process group",
                    "torch.distributed is not initialised in this process",
                    "call torch.distributed.init_process_group(...) first (torchrun sets the "
                    "environment for init_method='env://'), or pass process_group=None",
                )
            )
        group: Any = None  # the default group, looked up at each collective
    elif isinstance(process_group, dist.ProcessGroup):
        group = process_group
    else:
        raise SolverConfigError(
            message(
                "LMA(process_group=...) takes None, 'default' or a ProcessGroup",
                f"got {type(process_group).__name__}",
                "pass torch.distributed.new_group(...) or 'default'",
            )
        )
    backend = _group_backend(group)
    home = devices[0]
    if home.type == "cuda" and "nccl" in backend:
        device = home
    elif "gloo" in backend or (backend not in ("nccl",) and home.type == "cpu"):
        device = torch.device("cpu")
    else:
        raise SolverConfigError(
            message(
                f"LMA was given a process group with backend {backend!r} for model devices "
                f"{[str(d) for d in devices]}",
                "NCCL collectives need CUDA tensors"
                if "nccl" in backend
                else "this backend cannot be used from these devices",
                "use backend='gloo' for CPU models and 'nccl' for GPU models",
            )
        )
    return GroupScope(group=group, device=device, check=check_ranks())


def _not_finite_products(
    engine: JacobianEngine, batch: PreparedBatch, dtype: torch.dtype | None
) -> NormalProducts:
    """NaN products of this batch's shape: a rank's part when its residuals are not finite."""
    home = engine.replicas.devices[0]
    acc = dtype or engine.replicas.dtype
    k = batch.params
    return NormalProducts(
        jtj=torch.full((k, k), float("nan"), dtype=acc, device=home),
        jtr=torch.full((k,), float("nan"), dtype=acc, device=home),
        rss=float("nan"),
        rows=batch.rows,
    )


def summed_totals(packed: torch.Tensor, failure: ResidualNotFiniteError | None) -> list[float]:
    """``[‖r‖², N]`` summed over the ranks, the last two entries of an all-reduced vector;
    this rank's own failure is raised first, then the refusal of a rank whose residuals
    were finite when the sum is not (another rank's were NaN or infinite)."""
    totals: list[float] = packed[-2:].tolist()
    if failure is not None:
        raise failure
    if not math.isfinite(totals[0]):
        raise refused_elsewhere(
            "‖r‖² summed over the ranks is not finite: another rank's residuals are NaN "
            "or infinite (or their squares overflowed)"
        )
    return totals


def refused_elsewhere(what: str) -> ResidualNotFiniteError:
    """The error of a rank whose own residuals were finite, when another rank's were not."""
    return ResidualNotFiniteError(
        message(
            "finite residuals on every rank were expected",
            what,
            "the rank whose residuals are not finite names the sample in its own error; "
            "nothing was changed on any rank",
        )
    )
