"""Per-step metrics: reduced over the ranks when asked, printed and written on their periods.

A step's metrics are rank 0's own, or with ``all_reduce_metrics`` the mean over the W
ranks, m̄ = (1/W) Σ_r m_r (for a mean loss on equal per-rank batches, the loss of the
global batch). The reduction is a collective, so every rank takes part whenever a line is
due; only rank 0 prints (every ``print_every`` steps and at the last one) and writes
(every ``write_every`` steps and at the last one). The progress bar moves every step.
"""

from __future__ import annotations

from .. import _distributed as pg
from .._config import TrainConfig
from .._logging._run_logger import RunLogger
from .._state import TrainerState


def report_step(config: TrainConfig, state: TrainerState, logger: RunLogger) -> None:
    """Print, write and show the metrics of the step that just ended (``state.metrics``)."""
    last = state.step == config.max_iter
    due_print = config.verbose and (
        (config.print_every and state.step % config.print_every == 0) or last
    )
    due_write = bool(config.write_every and state.step % config.write_every == 0) or last
    if due_print or due_write:
        shown = (
            pg.mean_over_ranks(state.metrics, state.device)
            if config.all_reduce_metrics
            else state.metrics
        )
        if due_print:
            logger.print_line(state.step, state.epoch, shown)
        if due_write:
            logger.write(state.step, state.epoch, shown)
    logger.progress(state.step, state.metrics)
