"""The run plan: the run folder (its layout), the checkpoint to resume from, the sampler seed.

Every rank must agree on these before the first step (a different folder or seed on one
rank would split the run), so rank 0 decides and broadcasts its decision; an error on
rank 0 (a missing checkpoint) is raised on every rank, so none is left waiting.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import _distributed as pg
from .. import _settings
from .._config import DEFAULT_LOG_FOLDER, TrainConfig
from .._logging._base import notice
from .._logging._csv import CSV_NAME
from . import _files as ckpt


@dataclass(frozen=True)
class RunPlan:
    """What every rank must agree on before training: folder, checkpoint, sampler seed."""

    folder: str
    resume: str | None
    sampler_seed: int


#: perceptrain's run subfolder name: ``<n>_<YYYYmmddTHHMMSS>_<pid in hex>``.
RUN_NAME = re.compile(r"^(\d+)_(\d{8}T\d{6})_([0-9a-f]+)$")
#: What marks a folder as holding a run.
RUN_MARKS = (ckpt.CHECKPOINT_DIR, CSV_NAME, "hparams.json")


def run_folders(parent: Path) -> list[Path]:
    """The run subfolders of ``parent``, oldest first (by their number, then their name)."""
    if not parent.is_dir():
        return []
    found = [
        (int(m.group(1)), p.name, p) for p in parent.iterdir() if (m := RUN_NAME.match(p.name))
    ]
    return [p for _, _, p in sorted(found)]


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` already holds a run's files."""
    return any((folder / mark).exists() for mark in RUN_MARKS)


def new_run_name(parent: Path, taken: int) -> str:
    """A new run's subfolder name; ``n`` follows the runs in ``parent`` (and ``taken``)."""
    numbers = [int(RUN_NAME.match(p.name).group(1)) for p in run_folders(parent)]  # type: ignore[union-attr]
    n = max([taken, *numbers]) + 1
    return f"{n}_{time.strftime('%Y%m%dT%H%M%S')}_{os.getpid():x}"


def _given_log_folder(config: TrainConfig) -> Path | None:
    """The user's own ``log_folder`` (not the default, nor a run folder planned before)."""
    folder = Path(config.log_folder)
    if folder == DEFAULT_LOG_FOLDER or config.create_subfolder_per_run:
        return None
    if config._subfolders and folder == Path(config.root_folder) / config._subfolders[-1]:
        return None  # this configuration's previous run: a new run goes beside it
    return folder


def plan_run(config: TrainConfig) -> RunPlan:
    """Choose the run folder and the checkpoint to resume from (raises if it is missing).

    A fresh run writes into the given ``log_folder`` if it holds no run, else into a new
    run subfolder of it (or of ``root_folder``). A resumed run continues in the folder of
    the run it resumes: the newest run with a checkpoint (``"latest"``), or the run the
    given checkpoint file belongs to.
    """
    given = _given_log_folder(config)
    base = given if given is not None else Path(config.root_folder)
    resume = config.resume_from
    restarts = _settings.get_int("SLURM_RESTART_COUNT") or 0
    if resume is None and restarts > 0:
        notice(
            f"Slurm requeued this job ({restarts} restart(s)): resuming from the latest "
            "checkpoint (resume_from=None means 'latest' in a requeued job)"
        )
        resume = "latest"
    path: Path | None = None
    folder: Path | None = None
    if resume == "latest":
        path = ckpt.find_latest(*reversed(run_folders(base)), base)
    elif resume is not None:
        path = Path(resume)
        ckpt.read_checkpoint(path)  # missing or unreadable: fail now, before any work
    if path is not None and path.parent.name == ckpt.CHECKPOINT_DIR:
        folder = path.parent.parent  # continue in the run folder of the checkpoint
    if folder is None:
        if given is not None and not holds_run(given):
            folder = given
        else:
            name = new_run_name(base, len(config._subfolders))
            if given is None:
                config._subfolders.append(name)
            folder = base / name
    # Without TrainConfig.seed the sampler's seed comes from torch's global generator, so a
    # script that calls torch.manual_seed shuffles the same way each time (as a DataLoader
    # with shuffle=True would); rank 0's plan is the one every rank follows.
    seed = config.seed if config.seed is not None else int(torch.randint(2**31, ()).item())
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
