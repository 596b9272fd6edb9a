"""Validation: the mean loss over the whole validation loader, and the best checkpoint.

val_loss = Σ_b n_b · L_b / Σ_b n_b over the batches b of the loader (n_b samples each),
so batches of unequal size weigh by their samples; other metrics the loss returns are
averaged the same way, as ``val_<name>``. Every rank validates the whole loader (no
communication), so every rank sees the same numbers and callbacks decide alike. A new
lowest ``val_loss`` writes ``checkpoints/best.pt``.
"""

from __future__ import annotations

from typing import Any

import torch

from ._context import RunContext


def validate(context: RunContext, val_loader: Any) -> None:
    """Mean loss over the whole validation loader, on every rank (no communication)."""
    state, loop, logger = context.state, context.loop, context.logger
    context.hooks("on_validation_start")
    model = loop.model
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    extra: dict[str, float] = {}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for batch in val_loader:
            inputs, targets = loop.eval_batch(batch, state.device)
            output = context.loss_fn(model(inputs), targets)
            loss, metrics = output if isinstance(output, tuple) else (output, {})
            size = int(inputs.shape[0]) if hasattr(inputs, "shape") else 1
            total += float(loss) * size
            count += size
            for key, value in metrics.items():
                extra[f"val_{key}"] = extra.get(f"val_{key}", 0.0) + float(value) * size
    model.train(was_training)
    results = {"val_loss": total / max(count, 1)}
    results.update({k: v / max(count, 1) for k, v in extra.items()})
    state.val_metrics = results
    if logger is not None:
        logger.write(state.step, state.epoch, results, phase="val")
        logger.print_line(state.step, state.epoch, results, phase="val")
    if state.best_val is None or results["val_loss"] < state.best_val:
        state.best_val = results["val_loss"]
        assert context.checkpoints is not None
        context.checkpoints.save_best()
    context.schedule.after_validation(results)
    context.hooks("on_validation_end", results)
