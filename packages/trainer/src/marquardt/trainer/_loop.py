"""The training loop both loops share: steps over cycled epochs, stops, checkpoints.

The loop counts optimizer steps up to ``max_iter`` (one LM step, or one gradient step
over ``accumulate_grad_batches`` batches), cycling the loader over epochs. After each
step it reports the metrics, validates every ``val_every`` steps, and agrees with the
other ranks on whether to stop (SIGTERM on any rank, or a callback or LM asking): one
small all-reduce, so every rank stops at the same step. It checkpoints every
``checkpoint_every`` steps, on SIGTERM and at the end.

A stream (an ``IterableDataset``) in a data-parallel run can leave ranks with different
numbers of batches in an epoch. Left alone, the ranks would drift apart: one would start
epoch 2 (its hooks, its data order) while another is still in epoch 1, and a rank whose
epoch is empty would stop with an error while the others wait for it in the next
collective until ``dist_timeout``. So before each batch of a stream the ranks agree, with
one all-reduce of one flag, whether every rank still has one: the epoch ends on every
rank when the first runs out (the batches the others have left are not used in that
epoch), and an empty epoch is the same error on every rank. Samplers of map-style
datasets give every rank the same count, so they need no such check. The flag costs one
small collective per batch (about 1 ms with gloo between two processes on a busy 2-core
machine, next to 5-6 ms for a DDP step of a 193-parameter model; a fixed cost that larger
models hide). Agreeing once per window of k prefetched batches would be cheaper, but
would read data ahead of the step that uses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import _distributed as pg
from ._callbacks import run_hook
from ._ddp import gradient_step
from ._errors import ConfigError
from ._lm import lm_step
from ._logging import RunLogger
from ._metrics import report_step
from ._resume import save
from ._signals import GracefulStop
from ._validation import validate

if TYPE_CHECKING:
    from ._trainer import Trainer


def _while_every_rank_has_one(iterator: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """``iterator``'s batches until the first rank's iterator is exhausted (one flag each)."""
    end = object()
    while True:
        batch = next(iterator, end)
        (someone_out,) = pg.flags_any([batch is end], device)
        if someone_out:
            return
        yield batch


def batches(trainer: Trainer, loader: Any, sampler: Any) -> Iterator[Any]:
    """Batches forever, epoch after epoch, from the position in ``trainer.state``."""
    state = trainer.state
    batch_size = getattr(loader, "batch_size", None) or 1
    while True:
        if sampler is not None:
            sampler.set_epoch(state.epoch)
            sampler.skip_next(state.batch_in_epoch * batch_size)
        # Making an iterator draws a seed from the global RNG; fork it so the RNG stream
        # (dropout, ...) does not depend on where an epoch, or a resume, begins.
        with torch.random.fork_rng(devices=[]):
            iterator = iter(loader)
        if sampler is None:
            for _ in range(state.batch_in_epoch):  # resume without a resumable sampler
                next(iterator, None)
        if sampler is None and state.world_size > 1:
            # A stream split over ranks (prepare_loader refuses other sampler-less loaders
            # in a data-parallel run): its ranks may run out at different batches.
            iterator = _while_every_rank_has_one(iterator, state.device)
        fresh = state.batch_in_epoch == 0
        if fresh:
            run_hook(trainer, "on_epoch_start", state.epoch)
        produced = False
        for batch in iterator:
            produced = True
            state.batch_in_epoch += 1
            yield batch
        if fresh and not produced:
            raise ConfigError(
                "the training loader yielded no batch in a whole epoch. HINT: check the "
                "dataset is not empty (and, with several processes, has at least one "
                "batch per process)"
            )
        run_hook(trainer, "on_epoch_end", state.epoch)
        state.epoch += 1
        state.batch_in_epoch = 0


def run_loop(
    trainer: Trainer,
    net: nn.Module,
    loader: Any,
    sampler: Any,
    val_loader: Any,
    logger: RunLogger,
    stop: GracefulStop,
    folder: Path,
) -> None:
    """Train from ``trainer.state`` to ``max_iter`` steps, or until a stop is agreed."""
    cfg, state = trainer.config, trainer.state
    stream = batches(trainer, loader, sampler)
    run_hook(trainer, "on_train_start")
    saved_at = -1
    net.train()
    while state.step < cfg.max_iter:
        if trainer.is_lm:
            loss, metrics = lm_step(trainer, stream)
        else:
            loss, metrics = gradient_step(trainer, net, stream)
        state.step += 1
        state.metrics = {"loss": loss, **metrics}
        run_hook(trainer, "on_batch_end", loss, metrics)
        report_step(cfg, state, logger)
        if val_loader is not None and cfg.val_every and state.step % cfg.val_every == 0:
            validate(trainer, val_loader, logger, folder)
        interrupted, wants_stop = pg.flags_any([stop.requested, state.should_stop], state.device)
        if interrupted:
            state.interrupted = True
            state.stop_reason = state.stop_reason or "SIGTERM"
        if wants_stop and not state.should_stop:
            state.should_stop = True
            state.stop_reason = state.stop_reason or "another rank asked to stop"
        if (cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0) or interrupted:
            save(trainer, folder)
            saved_at = state.step
        if interrupted or state.should_stop:
            break
    if val_loader is not None and cfg.val_every and state.step % cfg.val_every != 0:
        validate(trainer, val_loader, logger, folder)
    if saved_at != state.step:
        save(trainer, folder)
    if state.interrupted:
        logger.message(
            f"SIGTERM: stopped after step {state.step}; checkpoint "
            f"{state.last_checkpoint} written. Restart with "
            "resume_from='latest' to continue"
        )
    elif state.should_stop:
        logger.message(f"stopped at step {state.step}: {state.stop_reason}")
    run_hook(trainer, "on_train_end")
