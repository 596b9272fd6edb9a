"""A run's state in a checkpoint, and back: what is saved, by whom, and how it is restored.

A checkpoint holds the bare model (no DDP ``module.`` prefix), the loop's optimizer state
(a torch optimizer's, or the LMA's), the LR scheduler's state, every rank's RNG state, the
position (step, epoch, batch in the epoch), the sampler seed, the best validation loss,
every rank's callback states (``_callback_state``) and the configuration (file format
and atomic writes: ``_files``). Every rank contributes its RNG and callback states and
rank 0 writes; on resume every rank loads the same file, so all agree on the step.

Beside it, in the run folder itself, rank 0 writes perceptrain's pair of files for the
epoch (``model_<Model>_ckpt_<epoch>_device_<device>.pt``, ``opt_<Optimizer>_ckpt_...``;
``..._ckpt_best_...`` for the best), which perceptrain's ``load_checkpoint`` and ours read
(``_helpers``). They are kept, every epoch's, as perceptrain keeps them; ``keep_checkpoints``
counts the resume files in ``checkpoints/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import _distributed as pg
from .._callbacks._base import Callback
from .._environments import ProcessLayout
from .._loops._context import RunContext
from .._loops._nonfinite import finite_model
from . import _callback_state as callback_state
from . import _files as ckpt
from ._helpers import write_checkpoint

#: The checkpoint entry of the LR scheduler's state (None without a scheduler).
SCHEDULER = "scheduler"


def check_checkpoint(
    data: dict[str, Any],
    path: Path,
    model: nn.Module,
    kind: str,
    optimizer_name: str,
    callbacks: Sequence[Callback],
) -> None:
    """``data`` fits this run: model, optimizer, loop kind, and the callbacks' saved states."""
    ckpt.check_fits(data, path, model, kind, optimizer_name)
    callback_state.check(data, path, callbacks)


def _plain(value: Any) -> Any:
    """Configuration values reduced to what ``torch.load(weights_only=True)`` accepts."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def payload(
    context: RunContext, rngs: list[Any], callbacks: list[dict[str, Any]]
) -> dict[str, Any]:
    """The checkpoint of the run as it stands, with every rank's RNG and callback states."""
    state, loop = context.state, context.loop
    return {
        "format": ckpt.FORMAT,
        "version": ckpt.VERSION,
        "kind": loop.kind,
        "step": state.step,
        "epoch": state.epoch,
        "batch_in_epoch": state.batch_in_epoch,
        "current_epoch": state.current_epoch,
        "model": ckpt.bare_state_dict(loop.model),
        "model_signature": ckpt.model_signature(loop.model),
        **loop.state_dict(),
        "optimizer_class": loop.optimizer_name,
        SCHEDULER: context.schedule.state_dict(),
        "rng": rngs,
        callback_state.ENTRY: callbacks,
        "sampler_seed": context.sampler_seed,
        "best_val": state.best_val,
        "world_size": state.world_size,
        "config": _plain(context.config.to_dict()),
        "torch_version": str(torch.__version__),
    }


def _finite(context: RunContext) -> bool:
    """A non-finite model is never written over, or rotated in for, a finite checkpoint
    (the non-finite guard said so when the fault came)."""
    return finite_model(context.loop.model)


def save(context: RunContext) -> None:
    """A numbered checkpoint (every rank's RNG, for exact resume), written by rank 0."""
    if not _finite(context):
        return
    callbacks = context.callbacks
    own = (ckpt.rng_state(), callback_state.capture(callbacks))
    gathered = pg.all_gather_object(own)
    if context.state.rank != 0:
        return
    rngs, states = [g[0] for g in gathered], [g[1] for g in gathered]
    directory = context.folder / ckpt.CHECKPOINT_DIR
    path = ckpt.atomic_save(
        payload(context, rngs, states), directory / ckpt.checkpoint_name(context.state.step)
    )
    ckpt.prune(directory, context.config.keep_checkpoints)
    context.state.last_checkpoint = path
    _write_pair(context, context.state.current_epoch)


def save_best(context: RunContext) -> None:
    """``best.pt``: the checkpoint at the best validation loss so far (rank 0 only)."""
    if context.state.rank == 0 and _finite(context):
        callbacks = [callback_state.capture(context.callbacks)]
        path = context.folder / ckpt.CHECKPOINT_DIR / ckpt.BEST_NAME
        ckpt.atomic_save(payload(context, [ckpt.rng_state()], callbacks), path)
        context.state.last_checkpoint = path
        _write_pair(context, "best")


def _write_pair(context: RunContext, iteration: int | str) -> None:
    """perceptrain's model and optimizer files of the run as it stands, in the run folder."""
    loop = context.loop
    write_checkpoint(context.folder, loop.model, loop.optimizer, iteration)


class Checkpoints:
    """The run's checkpoints as the runner asks for them (numbered, and ``best.pt``)."""

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def save(self) -> None:
        save(self.context)

    def save_best(self) -> None:
        save_best(self.context)


def restore(context: RunContext, data: dict[str, Any], layout: ProcessLayout) -> None:
    """Model, optimizer (or LMA), scheduler, position and this rank's callback states."""
    state, loop = context.state, context.loop
    loop.model.load_state_dict(ckpt.strip_prefixes(data["model"]))
    loop.load_state_dict(data)
    context.schedule.load_state_dict(data.get(SCHEDULER))
    state.step = int(data["step"])
    state.epoch = int(data["epoch"])
    state.batch_in_epoch = int(data["batch_in_epoch"])
    state.current_epoch = int(data.get("current_epoch", state.epoch))
    state.best_val = data.get("best_val")
    callback_state.restore(data, context.callbacks, layout.rank, layout.world_size)


def restore_rng(data: dict[str, Any], layout: ProcessLayout) -> None:
    """This rank's saved RNG state (rank 0's when the world size changed)."""
    rngs = data.get("rng") or []
    if not rngs:
        return
    same_world = len(rngs) == layout.world_size
    ckpt.set_rng_state(rngs[layout.rank] if same_world else rngs[0])
