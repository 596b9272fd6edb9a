"""A run's state in a checkpoint, and back: what is saved, by whom, and how it is restored.

A checkpoint holds the bare model (no DDP ``module.`` prefix), the optimizer's or the
LMA's state, every rank's RNG state, the position (step, epoch, batch in the epoch), the
sampler seed, the best validation loss, every rank's callback states
(:mod:`marquardt.trainer._callback_state`) and the configuration (file format and atomic
writes: :mod:`marquardt.trainer._checkpoint`). Every rank contributes its RNG and
callback states and rank 0 writes; on resume every rank loads the same file, so all agree
on the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from . import _callback_state as callback_state
from . import _checkpoint as ckpt
from . import _distributed as pg
from ._environments import ProcessLayout
from ._lm import sync_lma_replicas
from ._plan import RunPlan

if TYPE_CHECKING:
    from ._trainer import Trainer


def kind(trainer: Trainer) -> str:
    """The loop a checkpoint belongs to: ``"lm"`` or ``"ddp"``."""
    return "lm" if trainer.is_lm else "ddp"


def optimizer_class(trainer: Trainer) -> str:
    """The optimizer's class name, which a resumed run must share."""
    return type(trainer.optimizer).__name__


def check_resume(trainer: Trainer, plan: RunPlan) -> None:
    """Check the checkpoint fits the model before any process or step starts."""
    if plan.resume is None:
        return
    path = Path(plan.resume)
    check_checkpoint(trainer, ckpt.read_checkpoint(path), path)


def check_checkpoint(trainer: Trainer, data: dict[str, Any], path: Path) -> None:
    """``data`` fits this run: model, optimizer, loop, and the callbacks' saved states."""
    ckpt.check_fits(data, path, trainer.model, kind(trainer), optimizer_class(trainer))
    callback_state.check(data, path, trainer.config.callbacks)


def _plain(value: Any) -> Any:
    """Configuration values reduced to what ``torch.load(weights_only=True)`` accepts."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def payload(trainer: Trainer, rngs: list[Any], callbacks: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint of ``trainer`` as it stands, with every rank's RNG and callback states."""
    state = trainer.state
    return {
        "format": ckpt.FORMAT,
        "version": ckpt.VERSION,
        "kind": kind(trainer),
        "step": state.step,
        "epoch": state.epoch,
        "batch_in_epoch": state.batch_in_epoch,
        "model": ckpt.bare_state_dict(trainer.model),
        "model_signature": ckpt.model_signature(trainer.model),
        "optimizer": None if trainer.is_lm else trainer.optimizer.state_dict(),
        "lma": trainer.optimizer.state_dict() if trainer.is_lm else None,
        "optimizer_class": optimizer_class(trainer),
        "rng": rngs,
        callback_state.ENTRY: callbacks,
        "sampler_seed": trainer._sampler_seed,
        "best_val": state.best_val,
        "world_size": state.world_size,
        "config": _plain(trainer.config.to_dict()),
        "torch_version": str(torch.__version__),
    }


def save(trainer: Trainer, folder: Path) -> None:
    """A numbered checkpoint (every rank's RNG, for exact resume), written by rank 0."""
    own = (ckpt.rng_state(), callback_state.capture(trainer.config.callbacks))
    gathered = pg.all_gather_object(own)
    if trainer.state.rank != 0:
        return
    rngs, callbacks = [g[0] for g in gathered], [g[1] for g in gathered]
    directory = folder / ckpt.CHECKPOINT_DIR
    path = ckpt.atomic_save(
        payload(trainer, rngs, callbacks), directory / ckpt.checkpoint_name(trainer.state.step)
    )
    ckpt.prune(directory, trainer.config.keep_checkpoints)
    trainer.state.last_checkpoint = path


def save_best(trainer: Trainer, folder: Path) -> None:
    """``best.pt``: the checkpoint at the best validation loss so far (rank 0 only)."""
    if trainer.state.rank == 0:
        callbacks = [callback_state.capture(trainer.config.callbacks)]
        ckpt.atomic_save(
            payload(trainer, [ckpt.rng_state()], callbacks),
            folder / ckpt.CHECKPOINT_DIR / "best.pt",
        )


def load_state(trainer: Trainer, data: dict[str, Any]) -> None:
    """Model, optimizer (or LMA) and position from a checked checkpoint."""
    state = trainer.state
    trainer.model.load_state_dict(ckpt.strip_prefixes(data["model"]))
    if trainer.is_lm:
        trainer.optimizer.load_state_dict(data["lma"])
        sync_lma_replicas(trainer.optimizer)
    else:
        trainer.optimizer.load_state_dict(data["optimizer"])
    state.step = int(data["step"])
    state.epoch = int(data["epoch"])
    state.batch_in_epoch = int(data["batch_in_epoch"])
    state.best_val = data.get("best_val")


def restore_callbacks(trainer: Trainer, data: dict[str, Any], layout: ProcessLayout) -> None:
    """This rank's saved callback states (rank 0's when the world size changed)."""
    callback_state.restore(data, trainer.config.callbacks, layout.rank, layout.world_size)


def restore_rng(data: dict[str, Any], layout: ProcessLayout) -> None:
    """This rank's saved RNG state (rank 0's when the world size changed)."""
    rngs = data.get("rng") or []
    if not rngs:
        return
    same_world = len(rngs) == layout.world_size
    ckpt.set_rng_state(rngs[layout.rank] if same_world else rngs[0])
