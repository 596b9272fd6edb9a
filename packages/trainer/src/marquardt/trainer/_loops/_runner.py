"""The schedule both loops share: epochs of batches, stages, validation, stops, checkpoints.

perceptrain's schedule: the run trains epochs ``0 … max_iter`` (``max_iter + 1`` of them;
a resumed run continues up to ``max_iter``). An epoch is every batch of a loader with a
length (at most ``max_batches``), one batch of a loader without one (an infinite or
streaming dataset, whose iterator goes on across epochs), or one evaluation with no data
(``batch`` is ``None``). One optimizer step consumes ``batches_per_step`` batches of the
epoch (``accumulate_grad_batches``; the last group of an epoch may be shorter).

Around every batch, epoch, validation and the whole run the trainer enters perceptrain's
stages (``StageDispatch``): hook methods,
callbacks, ``opt_result``. What is printed, written, plotted and checkpointed on the
configured periods is done by the configuration's built-in callbacks
(``marquardt.trainer._callbacks._builtin``). Validation runs once before training when
``val_every`` is set (not again when a run resumes, so that a resumed run's callbacks see
the validations the uninterrupted run's saw), and after every epoch that is a multiple of
it.

After each step the ranks agree, with one small all-reduce, whether to stop (SIGTERM on
any rank, a callback, ``trainer.stop_training``'s flag or the LM loop asking) and whether
a checkpoint was asked for (``WallClockBudget``), so every rank stops at the same step;
they agree again after each validation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch

from .. import _distributed as pg
from .._callbacks._base import TrainingStage as Stage
from .._errors import ConfigError
from .._result import LossMetrics, with_phase
from .._signals import GracefulStop
from ._context import RunContext
from ._nonfinite import NonFiniteGuard
from ._validation import batches_per_epoch, validate


class EpochBatches:
    """The training batches, epoch by epoch, from the position in ``context.state``."""

    def __init__(self, context: RunContext, loader: Any, sampler: Any) -> None:
        self.context = context
        self.loader = loader
        self.sampler = sampler
        self.count = batches_per_epoch(loader, context.max_batches)
        self.sized = _has_len(loader)
        self._iterator: Iterator[Any] | None = None

    def _fresh(self) -> Iterator[Any]:
        # Making an iterator draws a seed from the global RNG; fork it so the RNG stream
        # (dropout, ...) does not depend on where an epoch, or a resume, begins.
        with torch.random.fork_rng(devices=[]):
            return iter(self.loader)

    def _next_unsized(self) -> Any:
        batch = next(self._iterator, _END) if self._iterator is not None else _END
        if batch is _END:
            self._iterator = self._fresh()
            batch = next(self._iterator, _END)
            if batch is _END:
                raise ConfigError(
                    "the training loader yielded no batch. HINT: check the dataset is not "
                    "empty (and, with several processes, has data for every process)"
                )
        return batch

    def epoch(self) -> Iterator[Any]:
        """This epoch's remaining batches (``None`` once when there is no data)."""
        state = self.context.state
        if self.loader is None:
            for _ in range(state.batch_in_epoch, self.count):
                yield None
            return
        if not self.sized:
            for _ in range(state.batch_in_epoch, self.count):
                yield self._next_unsized()
            return
        batch_size = getattr(self.loader, "batch_size", None) or 1
        if self.sampler is not None:
            self.sampler.set_epoch(state.epoch)
            self.sampler.skip_next(state.batch_in_epoch * batch_size)
        iterator = self._fresh()
        if self.sampler is None:
            for _ in range(state.batch_in_epoch):  # resume without a resumable sampler
                next(iterator, None)
        produced = False
        for batch in islice(iterator, self.count - state.batch_in_epoch):
            produced = True
            yield batch
        if state.batch_in_epoch == 0 and not produced:
            raise ConfigError(
                "the training loader yielded no batch in a whole epoch. HINT: check the "
                "dataset is not empty (and, with several processes, has at least one "
                "batch per process)"
            )


_END = object()


def _has_len(loader: Any) -> bool:
    try:
        len(loader)
    except TypeError:
        return False
    return True


def groups(batches: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """``batches`` in lists of ``size`` (the last may be shorter)."""
    while True:
        group = list(islice(batches, size))
        if not group:
            return
        yield group


def _batch_result(context: RunContext, loss: float, metrics: dict[str, float]) -> LossMetrics:
    """The step's ``(loss, train_* metrics)``, averaged over the ranks when asked."""
    if context.config.all_reduce_metrics:
        reduced = pg.mean_over_ranks({"loss": loss, **metrics}, context.state.device)
        loss = reduced.pop("loss")
        metrics = reduced
    tensors = {k: torch.tensor(v) for k, v in metrics.items()}
    return with_phase("train", torch.tensor(loss), tensors)


def _agree(context: RunContext, stop: GracefulStop) -> tuple[bool, bool]:
    """Every rank's stop and checkpoint requests, combined; ``(interrupted, checkpoint)``."""
    state, stages = context.state, context.stages
    asked = state.should_stop or stages.stop_requested()
    interrupted, wants_stop, wants_checkpoint = pg.flags_any(
        [stop.requested, asked, state.checkpoint_requested], state.device
    )
    if interrupted:
        state.interrupted = True
        state.stop_reason = state.stop_reason or "SIGTERM"
    if wants_stop and not state.should_stop:
        state.should_stop = True
        state.stop_reason = state.stop_reason or "a callback or another rank asked to stop"
    state.checkpoint_requested = wants_checkpoint
    return interrupted, wants_checkpoint


def _train_epoch(
    context: RunContext, source: EpochBatches, stop: GracefulStop, guard: NonFiniteGuard
) -> list[LossMetrics] | None:
    """One epoch's steps; ``None`` when a stop was agreed in the middle of it."""
    state, loop, stages = context.state, context.loop, context.stages
    checkpoints = context.checkpoints
    assert checkpoints is not None
    results: list[LossMetrics] = []
    for group in groups(source.epoch(), loop.batches_per_step):
        prepared = [loop.prepare_batch(batch, state.device) for batch in group]
        shown = prepared[0] if len(prepared) == 1 else prepared
        stages.hook("on_train_batch_start", shown)
        stages.start(Stage.TRAIN_BATCH_START)
        last = state.batch_in_epoch + len(group) >= source.count
        result = guard.step(prepared, state.device, epoch_end=last)
        if result is None:  # undone: the batch is skipped, the step taken on the next one
            state.batch_in_epoch += len(group)
            continue
        state.step += 1
        state.batch_in_epoch += len(group)
        state.metrics = {"loss": result.loss, **result.metrics}
        if result.stop_reason is not None:
            state.should_stop = True
            state.stop_reason = result.stop_reason
        context.schedule.after_step()
        batch_result = _batch_result(context, result.loss, result.metrics)
        results.append(batch_result)
        stages.end(Stage.TRAIN_BATCH_END, batch_result)
        stages.hook("on_train_batch_end", batch_result)
        interrupted, wants_checkpoint = _agree(context, stop)
        if interrupted or wants_checkpoint:
            checkpoints.save()
        if interrupted or (state.should_stop and state.batch_in_epoch < source.count):
            return None
    return results


def run_loop(
    context: RunContext, loader: Any, sampler: Any, val_loader: Any, stop: GracefulStop
) -> None:
    """Train from ``context.state`` through epoch ``max_iter``, or until a stop is agreed."""
    cfg, state, loop, logger = context.config, context.state, context.loop, context.logger
    stages = context.stages
    assert logger is not None
    source = EpochBatches(context, loader, sampler)
    validating = val_loader is not None and bool(cfg.val_every)
    state.current_epoch = state.epoch
    if validating and state.step == 0:
        validate(context, val_loader, hooks=False)
    state.started_at = time.monotonic()
    stages.start(Stage.TRAIN_START)
    stages.hook("on_train_start")
    train_losses: list[list[LossMetrics]] = []
    val_losses: list[list[LossMetrics]] = []
    loop.train()
    guard = NonFiniteGuard(context)  # each step, checked for a non-finite loss or model
    while state.epoch <= cfg.max_iter and not (state.should_stop or state.interrupted):
        state.current_epoch = state.epoch
        stages.hook("on_train_epoch_start")
        stages.start(Stage.TRAIN_EPOCH_START)
        results = _train_epoch(context, source, stop, guard)
        if results is None:
            break
        state.epoch += 1
        state.batch_in_epoch = 0
        train_losses.append(results)
        stages.end(Stage.TRAIN_EPOCH_END, results)
        stages.hook("on_train_epoch_end", results)
        context.schedule.after_epoch()
        if validating and state.current_epoch % cfg.val_every == 0:
            val_losses.append(validate(context, val_loader, hooks=True))
            loop.train()
        logger.progress(state.epoch, state.metrics)
        interrupted, wants_checkpoint = _agree(context, stop)
        if (interrupted or wants_checkpoint) and context.checkpoints is not None:
            context.checkpoints.save()
    if state.interrupted:
        logger.message(
            f"SIGTERM: stopped in epoch {state.current_epoch} after step {state.step}; "
            f"checkpoint {state.last_checkpoint} written. Restart with resume_from='latest' "
            "to continue"
        )
    elif state.should_stop:
        logger.message(f"stopped in epoch {state.current_epoch}: {state.stop_reason}")
    stages.hook("on_train_end", train_losses, val_losses)
    stages.end(Stage.TRAIN_END, train_losses[-1] if train_losses else [])
    if state.last_checkpoint is not None and state.rank == 0:
        logger.artifact(state.last_checkpoint)
    stages.idle()
