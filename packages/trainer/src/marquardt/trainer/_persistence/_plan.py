"""The run plan: the run folder (its layout), the checkpoint to resume from, the sampler seed.

Every rank must agree on these before the first step (a different folder or seed on one
rank would split the run), so rank 0 decides and broadcasts its decision; an error on
rank 0 (a missing checkpoint) is raised on every rank, so none is left waiting.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _distributed as pg
from .. import _settings
from .._config import TrainConfig
from .._logging._base import notice
from . import _files as ckpt


@dataclass(frozen=True)
class RunPlan:
    """What every rank must agree on before training: folder, checkpoint, sampler seed."""

    folder: str
    resume: str | None
    sampler_seed: int


def _run_name() -> str:
    job = _settings.get("SLURM_JOB_ID")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"run_{stamp}" + (f"_job{job}" if job else "")


def plan_run(config: TrainConfig) -> RunPlan:
    """Choose the run folder and the checkpoint to resume from (raises if it is missing)."""
    root = Path(config.root_folder)
    if config.log_folder is not None:
        folder = Path(config.log_folder)
    elif config.create_subfolder_per_run:
        folder = root / _run_name()
    else:
        folder = root
    resume = config.resume_from
    restarts = _settings.get_int("SLURM_RESTART_COUNT") or 0
    if resume is None and restarts > 0:
        notice(
            f"Slurm requeued this job ({restarts} restart(s)): resuming from the latest "
            "checkpoint (resume_from=None means 'latest' in a requeued job)"
        )
        resume = "latest"
    path: Path | None = None
    if resume == "latest":
        path = ckpt.find_latest(folder, root)
        if path is not None and config.log_folder is None and config.create_subfolder_per_run:
            folder = path.parent.parent  # continue in the run folder that was interrupted
    elif resume is not None:
        path = Path(resume)
        ckpt.read_checkpoint(path)  # missing or unreadable: fail now, before any work
    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**31)
    return RunPlan(str(folder), None if path is None else str(path), seed)


def agree_plan(config: TrainConfig, plan: RunPlan | None, rank: int) -> RunPlan:
    """Rank 0's plan on every rank (an error on rank 0 is raised on every rank)."""
    outcome: tuple[str, Any] | None = None
    if rank == 0:
        try:
            outcome = ("ok", plan if plan is not None else plan_run(config))
        except Exception as exc:
            outcome = ("error", exc)
    outcome = pg.broadcast_object(outcome)
    assert outcome is not None
    if outcome[0] == "error":
        raise outcome[1]
    result: RunPlan = outcome[1]
    return result
