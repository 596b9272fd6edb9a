"""The configuration's built-in callbacks, perceptrain's, wired to our loggers and checkpoints.

``TrainConfig``'s periods become these callbacks, bound where perceptrain binds them
(``config_callbacks``): ``PrintMetrics`` and ``WriteMetrics`` at ``train_epoch_end``
every ``print_every`` / ``write_every`` epochs (and ``WriteMetrics`` at ``val_epoch_end``
every ``val_every``), ``WritePlots`` every ``plot_every``, ``SaveCheckpoint`` every
``checkpoint_every`` and at the end, ``SaveBestCheckpoint`` at ``val_epoch_end`` with
``checkpoint_best_only``, ``LogHyperparameters`` and ``LogModelTracker`` at the end. A
user may also put any of them in ``TrainConfig.callbacks``, bound elsewhere
(``LoadCheckpoint`` lives with the checkpoint helpers it calls,
``marquardt.trainer._persistence._helpers``).

``writer`` is the run's ``RunLogger`` (idle
on ranks other than 0); checkpoints are our atomic files, written with every rank's RNG
state (so every rank takes part, and rank 0 writes).
"""

from __future__ import annotations

from typing import Any

from .._doclists import with_lists
from ._base import OWN_WORK_LISTS, Callback, TrainingStage


def _context(trainer: Any) -> Any:
    """The running trainer's run context (its checkpoints); ``None`` outside ``fit``."""
    return getattr(trainer, "_context", None)


def _checkpoints(trainer: Any) -> Any:
    """Where a checkpoint goes: the run's (during ``fit``), else the trainer's own folder
    checkpoints (perceptrain's pair in ``config.log_folder``); ``None`` without a trainer."""
    context = _context(trainer)
    if context is not None and context.checkpoints is not None:
        return context.checkpoints
    return getattr(trainer, "folder_checkpoints", None)


@with_lists(OWN_WORK_LISTS)
class PrintMetrics(Callback):
    """Print ``opt_result``'s metrics in perceptrain's format (rank, device, epoch, loss)."""

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        writer.print_metrics(trainer.opt_result)


@with_lists(OWN_WORK_LISTS)
class WriteMetrics(Callback):
    """Write ``opt_result``'s metrics to the tracking tools (and ``metrics.csv``)."""

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        opt_result = trainer.opt_result
        writer.write(opt_result.iteration, opt_result.metrics)


@with_lists(OWN_WORK_LISTS)
class WritePlots(Callback):
    """Write the figures of ``config.plotting_functions`` at this epoch."""

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        if config.plotting_functions:
            writer.plot(trainer.model, trainer.opt_result.iteration, config.plotting_functions)


#: The name the issue tracker and perceptrain's documentation also use for it.
PlotMetrics = WritePlots


@with_lists(OWN_WORK_LISTS)
class LogHyperparameters(Callback):
    """Log ``config.hyperparams`` to the tracking tools."""

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        writer.log_hyperparams(config.hyperparams)


@with_lists(OWN_WORK_LISTS)
class LogModelTracker(Callback):
    """Log the model (its weights, ``model.pt``) to the tracking tools."""

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        writer.log_model(
            trainer.model,
            getattr(trainer, "train_dataloader", None),
            getattr(trainer, "val_dataloader", None),
            getattr(trainer, "test_dataloader", None),
        )


@with_lists(OWN_WORK_LISTS)
class SaveCheckpoint(Callback):
    """Write a checkpoint of the run as it stands.

    During ``fit``: perceptrain's ``model_<Model>_ckpt_<epoch>_device_<device>.pt`` and
    ``opt_<Optimizer>_ckpt_...`` in the run folder, and the resume file
    ``checkpoints/ckpt_<step>.pt``. Outside ``fit``, perceptrain's pair in
    ``config.log_folder`` at ``opt_result.iteration``.
    """

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        checkpoints = _checkpoints(trainer)
        if checkpoints is not None:
            checkpoints.save()


class SaveBestCheckpoint(SaveCheckpoint):
    """Write the best checkpoint when ``opt_result.loss`` beats the best so far.

    The best checkpoint is perceptrain's ``..._ckpt_best_...`` pair in the run folder, and
    ``checkpoints/best.pt``; ``config.validation_criterion(loss, best, val_epsilon)``
    decides what beats the best.

    Arguments:
        on: the stage it runs at (default ``"val_epoch_end"``).
        called_every: run every that many epochs.

    Raises:
        ValueError: ``on`` is not a stage, or ``called_every`` is not a whole number >= 0.
    """

    def __init__(self, on: str | TrainingStage = "val_epoch_end", called_every: int = 1) -> None:
        super().__init__(on=on, called_every=called_every)
        self.best_loss = float("inf")

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        checkpoints = _checkpoints(trainer)
        state = getattr(trainer, "state", None)
        if state is not None and state.best_val is not None:
            self.best_loss = min(self.best_loss, float(state.best_val))
        loss = trainer.opt_result.loss
        criterion = config.validation_criterion
        if loss is None or criterion is None:
            return
        if criterion(float(loss), self.best_loss, config.val_epsilon):
            self.best_loss = float(loss)
            if state is not None:
                state.best_val = self.best_loss
            if checkpoints is not None:
                checkpoints.save_best()


def config_callbacks(config: Any) -> list[Callback]:
    """The callbacks ``config``'s periods ask for, bound as perceptrain binds them."""
    out: list[Callback] = [WritePlots(on="train_start")]
    if config.val_every:
        out.append(WriteMetrics(on="train_start"))
        if not config.checkpoint_best_only:
            out.append(SaveCheckpoint(on="train_start"))
    if config.checkpoint_best_only:
        out.append(SaveBestCheckpoint(on="val_epoch_end", called_every=config.val_every))
    elif config.checkpoint_every:
        out.append(SaveCheckpoint(on="train_epoch_end", called_every=config.checkpoint_every))
    if config.verbose and config.print_every:
        out.append(PrintMetrics(on="train_epoch_end", called_every=config.print_every))
    if config.plot_every:
        out.append(WritePlots(on="train_epoch_end", called_every=config.plot_every))
    if config.write_every:
        out.append(WriteMetrics(on="train_epoch_end", called_every=config.write_every))
    if config.val_every:
        out.append(WriteMetrics(on="val_epoch_end", called_every=config.val_every))
    if config.hyperparams:
        out.append(LogHyperparameters(on="train_end"))
    if config.log_model:
        out.append(LogModelTracker(on="train_end"))
    if config.plot_every:
        out.append(WritePlots(on="train_end"))
    if not config.checkpoint_best_only and config.checkpoint_every:
        out.append(SaveCheckpoint(on="train_end"))
    if config.write_every:
        out.append(WriteMetrics(on="train_end"))
    return out
