"""torch.distributed's collectives on one process group, each failure named: `Collectives`.

Nothing is home-made: every collective is torch.distributed's (gloo on CPUs, NCCL on
GPUs). What this adds is the error of a collective that fails (a peer died, hung past the
group's timeout, or raised before reaching it): a `RankFailureError` naming the rank that
saw it, the collective, the LM step and, where the rendezvous store still answers, the
ranks that did not answer a roll call (`roll_call`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..._errors import RankFailureError, RanksDisagreeError, message
from .roll_call import roll_call

__all__ = ["Collectives"]


@dataclass
class Collectives:
    """The collectives of one rank of ``group``, on tensors placed on ``device``.

    Arguments:
        group: a ``torch.distributed.ProcessGroup``, or None for torch.distributed's
            default group, looked up at every collective rather than held: a reference
            kept in an LMA would keep the group alive past ``destroy_process_group``
            until the interpreter's own teardown, where gloo's threads abort the process.
        device: where the collectives' tensors live (the CPU for gloo, the model's GPU
            for NCCL).

    ``step`` counts the LM steps finished (named in failures); the step scope advances it.
    """

    group: Any
    device: torch.device
    rank: int = field(init=False)
    world_size: int = field(init=False)
    step: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)

    @contextmanager
    def guarded(self, what: str) -> Iterator[None]:
        """Turn a failed collective inside the block into a `RankFailureError`.

        Arguments:
            what: the collective, as the error names it ("all-reduce of …").

        Raises:
            RankFailureError: a collective in the block raised ``RuntimeError``.
        """
        try:
            yield
        except RuntimeError as err:
            if isinstance(err, RankFailureError | RanksDisagreeError):
                raise
            absent = roll_call(self.rank, self.world_size, self.step)
            raise RankFailureError(
                message(
                    f"rank {self.rank} of {self.world_size} was in the {what} of LM step "
                    f"{self.step + 1}",
                    f"the collective failed ({type(err).__name__}: {str(err).strip()[:300]}); "
                    f"{absent}",
                    "a peer rank died, raised before the collective or hung past the process "
                    "group's timeout: read that rank's own error; every rank must call "
                    "LMA.step the same number of times with a non-empty share of the batch",
                )
            ) from err

    def sum_(self, *buffers: torch.Tensor, what: str) -> None:
        """All-reduce (sum) each of ``buffers``, in place; they must be on ``device``."""
        with self.guarded(what):
            for buf in buffers:
                dist.all_reduce(buf, group=self.group)

    def summed(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """The sum over ranks of ``tensor`` (any device), on ``tensor``'s device."""
        buf = tensor.to(self.device).contiguous()
        self.sum_(buf, what=what)
        return buf.to(tensor.device)

    def least(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """The smallest of each value over the ranks."""
        buf = torch.tensor(values, dtype=torch.int64, device=self.device)
        with self.guarded("minimum of the memory plans"):
            dist.all_reduce(buf, op=dist.ReduceOp.MIN, group=self.group)
        return tuple(int(v) for v in buf.tolist())

    def gathered(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (one shape on all ranks, on ``device``), in rank order."""
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        with self.guarded(what):
            dist.all_gather(out, tensor, group=self.group)
        return out

    def broadcast_(self, tensor: torch.Tensor, what: str) -> None:
        """The group's rank 0's ``tensor`` (on ``device``) on every rank, in place."""
        source = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        with self.guarded(what):
            dist.broadcast(tensor, src=source, group=self.group)
