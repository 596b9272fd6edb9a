"""The schedule both loops share: steps over cycled epochs, reports, validation, stops, checkpoints.

The runner counts steps of the :class:`~._base.Loop` up to ``max_iter`` (one LM step, or
one gradient step over ``accumulate_grad_batches`` batches), cycling the loader over
epochs. After each step it steps the LR schedule, reports the metrics, validates every
``val_every`` steps, and agrees with the other ranks on whether to stop (SIGTERM on any
rank, or a callback or the loop asking): one small all-reduce, so every rank stops at the
same step. It checkpoints every ``checkpoint_every`` steps, on SIGTERM, when a callback
asks (``WallClockBudget``) and at the end; with ``checkpoint_best_only`` only the last
two, and ``best.pt`` at each new lowest validation loss.

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
from typing import Any

import torch

from .. import _distributed as pg
from .._errors import ConfigError
from .._signals import GracefulStop
from ._context import RunContext
from ._nonfinite import NonFiniteGuard
from ._report import report_step
from ._validation import validate


def _while_every_rank_has_one(iterator: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """``iterator``'s batches until the first rank's iterator is exhausted (one flag each)."""
    end = object()
    while True:
        batch = next(iterator, end)
        (someone_out,) = pg.flags_any([batch is end], device)
        if someone_out:
            return
        yield batch


def batches(context: RunContext, loader: Any, sampler: Any) -> Iterator[Any]:
    """Batches forever, epoch after epoch, from the position in ``context.state``."""
    state = context.state
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
            context.hooks("on_epoch_start", state.epoch)
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
        context.hooks("on_epoch_end", state.epoch)
        context.schedule.after_epoch()
        state.epoch += 1
        state.batch_in_epoch = 0


def run_loop(
    context: RunContext, loader: Any, sampler: Any, val_loader: Any, stop: GracefulStop
) -> None:
    """Train from ``context.state`` to ``max_iter`` steps, or until a stop is agreed."""
    cfg, state, loop, logger = context.config, context.state, context.loop, context.logger
    checkpoints = context.checkpoints
    assert logger is not None and checkpoints is not None
    stream = batches(context, loader, sampler)
    validating = val_loader is not None and bool(cfg.val_every)
    context.hooks("on_train_start")
    saved_at = -1
    loop.train()
    guard = NonFiniteGuard(context)  # the step, checked for a non-finite loss or model
    while state.step < cfg.max_iter:
        result = guard.step(stream, context.hooks, state.device)
        state.step += 1
        state.metrics = {"loss": result.loss, **result.metrics}
        if result.stop_reason is not None:
            state.should_stop = True
            state.stop_reason = result.stop_reason
        context.schedule.after_step()
        context.hooks("on_batch_end", result.loss, result.metrics)
        report_step(cfg, state, logger)
        if validating and state.step % cfg.val_every == 0:
            validate(context, val_loader)
        interrupted, wants_stop, wants_checkpoint = pg.flags_any(
            [stop.requested, state.should_stop, state.checkpoint_requested], state.device
        )
        if interrupted:
            state.interrupted = True
            state.stop_reason = state.stop_reason or "SIGTERM"
        if wants_stop and not state.should_stop:
            state.should_stop = True
            state.stop_reason = state.stop_reason or "another rank asked to stop"
        state.checkpoint_requested = wants_checkpoint
        periodic = bool(cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0)
        if (periodic and not cfg.checkpoint_best_only) or interrupted or wants_checkpoint:
            checkpoints.save()
            saved_at = state.step
        if interrupted or state.should_stop:
            break
    if validating and state.step % cfg.val_every != 0:
        validate(context, val_loader)
    if saved_at != state.step and not cfg.checkpoint_best_only:
        checkpoints.save()
    if state.interrupted:
        logger.message(
            f"SIGTERM: stopped after step {state.step}; checkpoint "
            f"{state.last_checkpoint} written. Restart with "
            "resume_from='latest' to continue"
        )
    elif state.should_stop:
        logger.message(f"stopped at step {state.step}: {state.stop_reason}")
    if state.last_checkpoint is not None and state.rank == 0:
        logger.artifact(state.last_checkpoint)
    context.hooks("on_train_end")
