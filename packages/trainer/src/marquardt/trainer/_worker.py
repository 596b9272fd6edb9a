"""One training process: device, process group, agreed plan, resume, then the loop.

Every process of a run (the only one, each spawned child, each torchrun worker or srun
task) goes through :func:`run_worker`. It seeds, picks its device (the GPU its layout
names, the LMA's device, or the CPU), joins the process group, takes rank 0's plan,
resumes from the checkpoint on every rank (the ranks must agree on the step; each takes
back its callbacks' states), wraps the model in DDP and shards the loader by global rank. A collective that fails because a
peer died ends the process at once with :data:`PEER_FAILED_EXIT`.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from . import _callback_state as callback_state
from . import _checkpoint as ckpt
from . import _ddp
from . import _distributed as pg
from ._data import prepare_loader
from ._environments import ProcessLayout
from ._errors import CheckpointMismatchError
from ._handback import write_result
from ._logging import RunLogger
from ._loop import run_loop
from ._plan import RunPlan, agree_plan
from ._resume import check_checkpoint, load_state, restore_callbacks, restore_rng
from ._signals import GracefulStop

if TYPE_CHECKING:
    from ._trainer import Trainer

#: Exit status of a spawned process that stopped because a peer died (not the culprit).
PEER_FAILED_EXIT = 75


def _seed_everything(seed: int) -> None:
    """Seed Python's, torch's and (if installed) NumPy's global RNGs."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def _pick_device(trainer: Trainer, layout: ProcessLayout) -> torch.device:
    """This process's GPU (DDP on GPUs), the LMA's device (LM loop), or the CPU."""
    if trainer.compute.use_gpu and not trainer.is_lm:
        index = (
            trainer.environment.device_index(layout)
            if trainer.environment is not None
            else layout.local_rank % max(trainer.gpu_count, 1)
        )
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if trainer.is_lm:
        return next(trainer.model.parameters()).device
    return torch.device("cpu")


def run_worker(
    trainer: Trainer,
    layout: ProcessLayout,
    plan: RunPlan | None,
    result_path: str | None,
    train_loader: Any,
    val_loader: Any,
    env_init: bool,
) -> None:
    """Train as the process ``layout`` describes; rank 0 of a spawn writes ``result_path``."""
    state = trainer.state
    state.rank, state.local_rank = layout.rank, layout.local_rank
    state.world_size = layout.world_size
    stop = GracefulStop(f"rank {layout.rank}")
    stop.install()
    try:
        if trainer.config.seed is not None:
            _seed_everything(trainer.config.seed)
        state.device = _pick_device(trainer, layout)
        if layout.world_size > 1:
            pg.init_process_group(
                layout, trainer.compute.backend, pg.timeout_seconds(trainer.config), env_init
            )
        try:
            agreed = agree_plan(trainer.config, plan, state.rank)
            _train(trainer, layout, agreed, stop, train_loader, val_loader, result_path)
        except Exception as exc:
            if layout.world_size > 1 and pg.is_collective_failure(exc):
                pg.abandon_after_peer_failure(layout.rank, exc, PEER_FAILED_EXIT)
            raise
    finally:
        stop.uninstall()
        pg.destroy_process_group()


def _train(
    trainer: Trainer,
    layout: ProcessLayout,
    plan: RunPlan,
    stop: GracefulStop,
    train_loader: Any,
    val_loader: Any,
    result_path: str | None,
) -> None:
    """Resume, wrap, shard, log, run the loop; then hand the result back if asked."""
    cfg, state = trainer.config, trainer.state
    model = trainer.model
    if not trainer.is_lm:
        model.to(device=state.device)
        if cfg.torch_dtype is not None:
            model.to(dtype=cfg.torch_dtype)
    folder = Path(plan.folder)
    state.log_folder = folder
    data = None
    if plan.resume is not None:
        path = Path(plan.resume)
        data = ckpt.read_checkpoint(path)
        check_checkpoint(trainer, data, path)
        load_state(trainer, data)
        restore_callbacks(trainer, data, layout)
    # A callback whose state cannot be checkpointed fails now, not at the first checkpoint.
    callback_state.capture(cfg.callbacks)
    steps = pg.all_gather_object(state.step)
    if len(set(steps)) > 1:
        raise CheckpointMismatchError(
            f"the ranks resumed at different steps ({dict(enumerate(steps))}). HINT: every "
            "rank must see the same checkpoint folder (a shared file system), or pass "
            "resume_from=<path> explicitly"
        )
    sampler_seed = int(data["sampler_seed"]) if data is not None else plan.sampler_seed
    net = _ddp.wrap(model, state.device, layout.world_size)
    loader, sampler = prepare_loader(train_loader, layout.rank, layout.world_size, sampler_seed)
    if data is not None:
        restore_rng(data, layout)
    logger = RunLogger(cfg, folder, layout.rank == 0, state.step, describe(trainer, layout))
    if data is not None:
        logger.message(
            f"resumed from {plan.resume} at step {state.step} (epoch "
            f"{state.epoch}, batch {state.batch_in_epoch})"
        )
    trainer._sampler_seed = sampler_seed
    try:
        run_loop(trainer, net, loader, sampler, val_loader, logger, stop, folder)
    finally:
        logger.close()
    if result_path is not None:
        write_result(trainer, result_path)


def describe(trainer: Trainer, layout: ProcessLayout) -> str:
    """The run's first line: loop, launcher, world size, device, steps."""
    where = (
        trainer.environment.name if trainer.environment is not None else trainer._environment_name
    )
    loop = "LM loop" if trainer.is_lm else f"DDP loop ({trainer.compute.backend})"
    return (
        f"{loop}, {where}, world size {layout.world_size}, device {trainer.state.device}, "
        f"{trainer.config.max_iter} steps"
    )
