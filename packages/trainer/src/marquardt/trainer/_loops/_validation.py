"""Validation and test passes: the loss of each batch, and their mean over the pass.

val_loss = (1/B) Σ_b L_b over the B batches of the pass (perceptrain's unweighted mean;
other metrics the loss returns are averaged the same way, as ``val_<name>``). Every rank
validates the whole validation loader (no communication unless ``all_reduce_metrics``),
so every rank sees the same numbers and callbacks decide alike. What is written and
checkpointed after a validation is done by the callbacks bound to ``val_epoch_end``.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import torch

from .. import _distributed as pg
from .._callbacks._base import TrainingStage as Stage
from .._callbacks._dispatch import StageDispatch
from .._loss import loss_and_metrics
from .._result import LossMetrics, detached, with_phase
from ..optimize_step import _to
from ._context import RunContext


def batches_per_epoch(loader: Any, max_batches: int | None) -> int:
    """The batches of one epoch: ``len(loader)`` (at most ``max_batches``), else 1."""
    if loader is None:
        return 1
    try:
        count = len(loader)
    except TypeError:
        return 1
    return count if max_batches is None else min(count, max_batches)


def evaluate_batch(
    loss_fn: Any, model: Any, batch: Any, phase: str, reduce_on: torch.device | None
) -> LossMetrics:
    """``(loss, {phase_*})`` of one batch without gradients (mean over ranks if asked)."""
    with torch.no_grad():
        loss, metrics = loss_and_metrics(loss_fn(batch, model))
    if reduce_on is not None:
        plain = {"loss": float(loss), **{k: float(detached(v)) for k, v in metrics.items()}}
        reduced = pg.mean_over_ranks(plain, reduce_on)
        loss = torch.tensor(reduced.pop("loss"))
        metrics = {k: torch.tensor(v) for k, v in reduced.items()}
    return with_phase(phase, loss, metrics)


def validate(context: RunContext, val_loader: Any, *, hooks: bool) -> list[LossMetrics]:
    """One pass over the validation loader, on every rank; its results per batch.

    ``hooks``: call the trainer's ``on_val_epoch_start`` / ``on_val_epoch_end`` (perceptrain
    calls them for the validations after epochs, not for the one before training).
    """
    state, loop, stages, cfg = context.state, context.loop, context.stages, context.config
    if hooks:
        stages.hook("on_val_epoch_start")
    stages.start(Stage.VAL_EPOCH_START)
    model = loop.model
    was_training = model.training
    model.eval()
    reduce_on = state.device if cfg.all_reduce_metrics else None
    results: list[LossMetrics] = []
    with torch.random.fork_rng(devices=[]):
        count = batches_per_epoch(val_loader, context.max_batches)
        for batch in islice(val_loader, count):
            batch = _to(batch, state.device, loop.dtype)
            stages.hook("on_val_batch_start", batch)
            stages.start(Stage.VAL_BATCH_START)
            result = evaluate_batch(context.loss_fn, model, batch, "val", reduce_on)
            results.append(result)
            stages.end(Stage.VAL_BATCH_END, result)
            stages.hook("on_val_batch_end", result)
    model.train(was_training)
    stages.end(Stage.VAL_EPOCH_END, results)
    opt_result = stages.owner.opt_result
    state.val_metrics = {k: float(v) for k, v in opt_result.metrics.items()}
    context.schedule.after_validation(state.val_metrics)
    if hooks:
        stages.hook("on_val_epoch_end", results)
    return results


def run_test(
    stages: StageDispatch,
    loss_fn: Any,
    model: Any,
    loader: Any,
    device: torch.device,
    dtype: torch.dtype | None,
    max_batches: int | None,
) -> list[LossMetrics]:
    """Every batch of ``loader`` (one ``None`` batch without one) with the ``test_batch_*``
    hooks and callbacks; the batches' ``(loss, {"test_loss": ..., "test_<metric>": ...})``."""
    was_training = model.training
    model.eval()
    results: list[LossMetrics] = []
    batches = [None] if loader is None else islice(loader, batches_per_epoch(loader, max_batches))
    try:
        for batch in batches:
            batch = _to(batch, device, dtype)
            stages.hook("on_test_batch_start", batch)
            stages.start(Stage.TEST_BATCH_START)
            result = evaluate_batch(loss_fn, model, batch, "test", None)
            results.append(result)
            stages.end(Stage.TEST_BATCH_END, result)
            stages.hook("on_test_batch_end", result)
    finally:
        model.train(was_training)
        stages.idle()
    return results
