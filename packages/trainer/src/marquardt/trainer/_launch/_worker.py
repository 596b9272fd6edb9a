"""One training process: device, process group, agreed plan, resume, then the runner.

Every process of a run (the only one, each spawned child, each torchrun worker or srun
task) goes through ``run_worker``. It sets its threads (``marquardt.devices``' rule: the
cores this process may use over the training processes on its node, unless
``OMP_NUM_THREADS``, the user's ``torch.set_num_threads`` or ``threads_per_process`` says
otherwise; a spawning parent chose for its children), seeds, picks its device (the loop
decides: the GPU its layout names, the LMA's device, or the CPU), joins the process group,
takes rank 0's plan, builds its data (a dataset factory is called here), resumes from the
checkpoint on every rank (the ranks must agree on the step; each takes back its callbacks' states),
sets the loop up for the world and shards the loader by global rank. A collective that
fails because a peer died ends the process at once with ``PEER_FAILED_EXIT``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from marquardt.devices import ThreadChoice, apply_threads, choose_threads

from .. import _disk as disk
from .. import _distributed as pg
from .._callbacks._base import CallbacksManager
from .._callbacks._builtin import config_callbacks
from .._callbacks._dispatch import StageDispatch
from .._data._loaders import prepare_loader
from .._data._sources import DataSource
from .._environments import LaunchEnvironment, ProcessLayout
from .._errors import CheckpointMismatchError
from .._logging._run_logger import RunLogger
from .._loops._context import RunContext
from .._loops._runner import run_loop
from .._persistence import _callback_state as callback_state
from .._persistence import _files as ckpt
from .._persistence._handback import write_result
from .._persistence._plan import RunPlan, agree_plan
from .._persistence._run_state import Checkpoints, check_checkpoint, restore, restore_rng
from .._signals import GracefulStop

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


def _threads(
    context: RunContext, environment: LaunchEnvironment, layout: ProcessLayout
) -> ThreadChoice:
    """This process's threads: the spawning parent's choice, else the rule for its node."""
    if context.threads is not None:
        return context.threads
    return choose_threads(
        layout.local_world_size, context.config.threads_per_process, environment.name
    )


def run_worker(
    context: RunContext,
    environment: LaunchEnvironment,
    layout: ProcessLayout,
    plan: RunPlan | None,
    data: DataSource,
    result_path: str | None = None,
) -> None:
    """Train as the process ``layout`` describes; rank 0 of a spawn writes ``result_path``."""
    state = context.state
    state.rank, state.local_rank = layout.rank, layout.local_rank
    state.world_size = layout.world_size
    stop = GracefulStop(f"rank {layout.rank}")
    stop.install()
    try:
        context.threads = _threads(context, environment, layout)
        apply_threads(context.threads)
        if context.config.seed is not None:
            _seed_everything(context.config.seed)
        state.device = context.loop.pick_device(
            context.compute.use_gpu, lambda: environment.device_index(layout)
        )
        if layout.world_size > 1:
            pg.init_process_group(
                layout,
                context.compute.backend,
                pg.timeout_seconds(context.config),
                environment.init_method(layout),
            )
        try:
            agreed = agree_plan(context.config, plan, state.rank)
            _train(context, layout, agreed, stop, data, result_path)
        except Exception as exc:
            if layout.world_size > 1 and pg.is_collective_failure(exc):
                pg.abandon_after_peer_failure(layout.rank, exc, PEER_FAILED_EXIT)
            raise
    finally:
        stop.uninstall()
        context.loop.teardown()
        pg.destroy_process_group()


def _resume(context: RunContext, layout: ProcessLayout, plan: RunPlan) -> dict[str, Any] | None:
    """Every rank loads the planned checkpoint (if any) and checks they agree on the step."""
    data = None
    if plan.resume is not None:
        path = Path(plan.resume)
        data = ckpt.read_checkpoint(path)
        loop = context.loop
        check_checkpoint(data, path, loop.model, loop.kind, loop.optimizer_name, context.callbacks)
        restore(context, data, layout)
        if layout.rank == 0:  # the last finite checkpoint until this run writes one
            context.state.last_checkpoint = path
    # A callback whose state cannot be checkpointed fails now, not at the first checkpoint.
    callback_state.capture(context.callbacks)
    steps = pg.all_gather_object(context.state.step)
    if len(set(steps)) > 1:
        raise CheckpointMismatchError(
            f"the ranks resumed at different steps ({dict(enumerate(steps))}). HINT: every "
            "rank must see the same checkpoint folder (a shared file system), or pass "
            "resume_from=<path> explicitly"
        )
    return data


def _train(
    context: RunContext,
    layout: ProcessLayout,
    plan: RunPlan,
    stop: GracefulStop,
    data: DataSource,
    result_path: str | None,
) -> None:
    """Build the data, set up, resume, shard, log, run; then hand the result back if asked."""
    state = context.state
    train_loader, val_loader = data.loaders()
    context.folder = Path(plan.folder)
    context.checkpoints = Checkpoints(context)
    state.log_folder = context.folder
    # Set up (model on its device) before the optimizer state is loaded onto its parameters.
    context.loop.setup(state.device, layout.world_size)
    if layout.rank == 0:  # the run folder can take files, and two checkpoints
        loop = context.loop
        size = disk.checkpoint_bytes(loop.model, loop.state_dict())
        disk.preflight(context.folder, size, context.config.keep_checkpoints)
    saved = _resume(context, layout, plan)
    context.sampler_seed = int(saved["sampler_seed"]) if saved is not None else plan.sampler_seed
    loader, sampler = prepare_loader(
        train_loader, layout.rank, layout.world_size, context.sampler_seed
    )
    if saved is not None:
        restore_rng(saved, layout)
    config = context.config
    logger = RunLogger(
        context.folder,
        layout.rank == 0,
        state.step,
        context.describe(),
        max_iter=config.max_iter,
        verbose=config.verbose,
        params={"config": config.to_dict(), "hyperparams": config.hyperparams},
        tools=config.tracking,
        state=state,
    )
    context.logger = logger
    if layout.rank == 0 and context.threads is not None:
        logger.message(f"threads: {context.threads.describe()}")
    # perceptrain's order: the user's callbacks, then the configuration's built-ins.
    manager = CallbacksManager([*context.callbacks, *config_callbacks(config)], config, logger)
    context.stages = StageDispatch(context.owner, manager, state)
    attach = getattr(context.owner, "_attach", None)
    if attach is not None:
        attach(context, train_loader, val_loader)
    if saved is not None:
        logger.message(
            f"resumed from {plan.resume} at epoch {state.epoch}, batch "
            f"{state.batch_in_epoch} (step {state.step})"
        )
    try:
        run_loop(context, loader, sampler, val_loader, stop)
    finally:
        logger.close()
    if result_path is not None:
        write_result(context, result_path)
