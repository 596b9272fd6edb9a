"""The process group: rendezvous with a timeout, collectives, and what to do when a peer dies.

A data-parallel step is only correct if every process joins every collective. Two things
keep a fault from turning into a hang: the process group has a timeout
(``TrainConfig.dist_timeout``), after which a collective waiting for a dead peer fails;
and a failed collective is reported as ``WorkerFailedError`` naming this rank, so
the process exits non-zero and the launcher stops the others.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from . import _settings
from ._config import TrainConfig
from ._environments import ProcessLayout
from ._errors import LaunchError, WorkerFailedError


def check_backend_available(backend: str) -> None:
    """The chosen backend must be compiled into this torch build."""
    available = {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    if not available.get(backend, False):
        raise LaunchError(
            f"backend {backend!r} was asked for but this torch build ({torch.__version__}) does "
            f"not include it. HINT: use backend='gloo' (always built), or install a torch build "
            f"with {backend} support"
        )


def timeout_seconds(config: TrainConfig) -> float:
    """``MARQUARDT_TRAINER_DIST_TIMEOUT`` if set, else ``TrainConfig.dist_timeout``."""
    return _settings.dist_timeout_override() or float(config.dist_timeout)


def init_process_group(
    layout: ProcessLayout, backend: str, seconds: float, init_method: str
) -> None:
    """Join the process group of ``layout`` at ``init_method`` (torchrun's: ``env://``)."""
    check_backend_available(backend)
    timeout = datetime.timedelta(seconds=seconds)
    # torch._dynamo, imported once the group exists (torch.func imports it: the LM loop's
    # Jacobians of custom modules), holds ten references to the default group past
    # destroy_process_group; gloo's threads then outlive it, and about one exit in ten
    # aborts ("terminate called without an active exception"). Imported first, it holds
    # none (0.8 s, once per training process).
    import torch._dynamo  # noqa: F401

    try:
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=layout.rank,
            world_size=layout.world_size,
            timeout=timeout,
        )
    except Exception as exc:
        raise WorkerFailedError(
            f"rank {layout.rank}: could not join the process group of {layout.world_size} "
            f"processes at {init_method} within {seconds:.0f} s ({type(exc).__name__}: {exc}). "
            "HINT: check that every rank was started, that MASTER_ADDR is reachable from every "
            "node and MASTER_PORT is free; the other ranks' logs say why they did not join",
            rank=layout.rank,
        ) from exc


def destroy_process_group() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    """The processes in the group (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (identity without a process group)."""
    if world_size() == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def all_gather_object(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order (``[value]`` without a process group)."""
    if world_size() == 1:
        return [value]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, value)
    return out


def mean_over_ranks(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """The average of each value over the ranks (keys must agree; sorted for a fixed order)."""
    if world_size() == 1 or not values:
        return dict(values)
    keys = sorted(values)
    packed = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    if device.type == "cuda":
        packed = packed.to(torch.float32)  # NCCL reductions of float64 are fine, but keep it light
    dist.all_reduce(packed)
    packed = packed / world_size()
    return {k: float(v) for k, v in zip(keys, packed.tolist(), strict=True)}


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a collective that lost a peer (or timed out)."""
    if isinstance(exc, dist.DistError) or type(exc).__name__ == "RankFailureError":
        # RankFailureError: marquardt.solver's LMA lost a peer inside a step's collective.
        return True
    text = str(exc)
    markers = (
        "Gloo",
        "gloo",
        "NCCL",
        "Connection closed",
        "Connection reset",
        "timed out",
        "Timeout",
        "ProcessGroup",
        "c10d",
    )
    return isinstance(exc, RuntimeError) and any(m in text for m in markers)


def abandon_after_peer_failure(rank: int, exc: BaseException, status: int) -> NoReturn:
    """Report a lost peer and end this process at once, with ``status``.

    A process group that lost a peer cannot be torn down safely: destroying it (or the DDP
    reducer holding it) joins gloo's worker thread while holding the GIL, and that thread may
    need the GIL to drop a pending work item — a deadlock, i.e. the hang this module exists
    to prevent. So the process reports and leaves through ``os._exit`` (no finalisers).
    """
    report_peer_failure(rank, exc)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def report_peer_failure(rank: int, exc: BaseException) -> WorkerFailedError:
    """Say on stderr that a collective of ``rank`` lost a peer; the error, for a caller."""
    message = (
        f"rank {rank}: a collective failed ({type(exc).__name__}: {str(exc).strip()[:300]}); "
        "another training process most probably died or stopped answering. HINT: the first "
        "rank that failed says why in its own output (spawn and torchrun name it)"
    )
    sys.stderr.write(f"marquardt.trainer: {message}\n")
    return WorkerFailedError(message, rank=None)


def flags_any(flags: list[bool], device: torch.device) -> list[bool]:
    """For each flag, whether it is true on any rank (one small all-reduce)."""
    if world_size() == 1:
        return list(flags)
    value = torch.tensor([1.0 if f else 0.0 for f in flags], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return [bool(v > 0) for v in value.tolist()]
