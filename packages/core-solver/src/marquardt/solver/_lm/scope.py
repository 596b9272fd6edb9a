"""Where the products of one LM step come from: `LocalScope` or `GroupScope`.

`LocalScope` is the one-process step (no collective); `GroupScope` the step of one rank of
a torch.distributed process group, built from the parts in ``group/`` (collectives and
their failures, the broadcasts from rank 0, the refusal of a batch, the agreement check)
and the cross-rank assembly (``assembly_ranks.py``); ``LMA`` holds one of them, chosen
once by `step_scope`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from marquardt.jacobian import ColumnSubset, JacobianEngine, PreparedBatch, Replicas

from .._errors import SolverConfigError, message
from .._settings import check_ranks
from .assembly import Assembly, assemble
from .assembly_ranks import assemble_across_ranks
from .group import (
    Collectives,
    broadcast_parameters,
    check_agreement,
    common_seed,
    refuse,
)
from .group.threads import share_threads
from .report import StepReport

__all__ = ["DEFAULT_GROUP", "GroupScope", "LocalScope", "StepScope", "step_scope"]

#: ``LMA(process_group=DEFAULT_GROUP)``: torch.distributed's default (world) group.
DEFAULT_GROUP = "default"


class StepScope:
    """Where the products of one step come from: this process alone (`LocalScope`, whose
    behaviour these defaults are) or a process group (`GroupScope`, which overrides how
    its ranks combine). The calls of a step are written once, here."""

    world_size: int = 1

    def sync_parameters(self, replicas: Replicas) -> None:
        """Make every rank start from the same θ (one process: nothing to do)."""

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
        """The local batch, planned with the strategy the *global* batch needs: with
        ``strategy="auto"``, in one process the planner's (which may time the strategies
        and go matrix-free); in a process group accumulate when the rows of all ranks
        reach P, else explicit (the same on every rank)."""
        batch = engine.prepare(
            inputs, targets, slice_size, strategy=strategy, checked=True, columns=columns
        )
        if strategy != "auto" or self.world_size == 1:
            return batch
        wanted = "accumulate" if self.global_rows(batch) >= batch.params else "explicit"
        if wanted == batch.strategy:
            return batch
        return engine.prepare(
            inputs, targets, slice_size, strategy=wanted, checked=True, columns=columns
        )

    def global_rows(self, batch: PreparedBatch) -> int:
        """The residual rows of the global batch of which ``batch`` is this rank's share."""
        return batch.rows

    @property
    def assemble(self) -> Callable[..., Assembly]:
        """The function that assembles the step's global system, called as `assemble`
        (``engine, backend, batch, request``): `assemble` itself, the batch being the
        whole batch."""
        return assemble

    def mean_loss(self, loss: torch.Tensor, batch: PreparedBatch, *, custom: bool) -> torch.Tensor:
        """The global loss from this rank's loss on its batch."""
        return loss

    def common_seed(self, seed: int | None) -> int | None:
        """The seed every rank draws parameter subsets from (rank 0's)."""
        return seed

    def least(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """The smallest of each value over the ranks (a memory plan all ranks can take)."""
        return values

    def refuse(self, strategy: str) -> None:
        """Take part in the step this rank refused before planning (``group/refusal.py``);
        one process: nothing to tell."""

    def finish(self, report: StepReport, replicas: Replicas) -> None:
        """Called once per step, after the attempts (one process: nothing to check)."""


class LocalScope(StepScope):
    """The one-process step: the batch is the whole batch, nothing crosses a network."""


@dataclass
class GroupScope(StepScope):
    """The step of one rank of a process group: local products, combined by collectives.

    Arguments:
        collectives: this rank's collectives on its group (`Collectives`).
        check: compare the ranks' states after every step (`check_agreement`).
    """

    collectives: Collectives
    check: bool = False
    world_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.world_size = self.collectives.world_size

    def sync_parameters(self, replicas: Replicas) -> None:
        """θ of the group's rank 0 on every rank (as DDP does when it wraps a model)."""
        broadcast_parameters(self.collectives, replicas)

    def common_seed(self, seed: int | None) -> int | None:
        """Rank 0's seed on every rank (drawn there when None), so that random parameter
        subsets select the same columns on every rank."""
        return common_seed(self.collectives, seed)

    def least(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """The smallest of each value over the ranks."""
        return self.collectives.least(values)

    def refuse(self, strategy: str) -> None:
        """This rank's part in a step whose batch it refused before planning it."""
        refuse(self.collectives, strategy)

    def global_rows(self, batch: PreparedBatch) -> int:
        """The rows of every rank's share, summed over the group."""
        rows = self.collectives.summed(
            torch.tensor([float(batch.rows)], dtype=torch.float64), "sum of the row counts"
        )
        return int(rows[0])

    @property
    def assemble(self) -> Callable[..., Assembly]:
        """`assemble_across_ranks` on this rank's collectives."""
        return partial(assemble_across_ranks, self.collectives)

    def mean_loss(self, loss: torch.Tensor, batch: PreparedBatch, *, custom: bool) -> torch.Tensor:
        """Σₖ Lₖwₖ / Σₖ wₖ with wₖ this rank's rows (mean of squares) or samples (custom)."""
        weight = float(batch.samples if custom else batch.rows)
        pair = torch.stack(
            [
                loss.to(torch.float64) * weight,
                torch.tensor(weight, dtype=torch.float64).to(loss.device),
            ]
        )
        total = self.collectives.summed(pair, "all-reduce of the trial loss")
        return total[0] / total[1]

    def finish(self, report: StepReport, replicas: Replicas) -> None:
        """Count the step; with ``check``, compare the ranks' states (`check_agreement`)."""
        self.collectives.step += 1
        if self.check:
            check_agreement(self.collectives, report, replicas)


def step_scope(process_group: object, devices: list[torch.device]) -> StepScope:
    """The scope for ``LMA(process_group=...)``.

    Arguments:
        process_group: None (one process), ``DEFAULT_GROUP`` or a ``ProcessGroup``.
        devices: the model devices (the first decides where collectives' tensors live).

    Raises:
        SolverConfigError: no torch.distributed, an unknown group name, the default group
            not initialised, or a group backend that cannot serve these devices.
    """
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
    backend = str(dist.get_backend(group)).lower()
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
    if home.type == "cpu":
        share_threads(group)  # each rank's torch threads: the node's cores over its ranks
    return GroupScope(Collectives(group=group, device=device), check=check_ranks())
