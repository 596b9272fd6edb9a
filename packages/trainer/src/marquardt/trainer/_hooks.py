"""The hook methods a ``Trainer`` subclass overrides: perceptrain's, called at each stage.

They run in every training process, the start of a stage before the callbacks bound to
it and its end after them (:mod:`marquardt.trainer._callbacks._dispatch`). Results are
``(loss, metrics)`` pairs with phase-named metrics (``train_loss``, ``val_<metric>``...):
one per batch, a list of them per epoch, a list of epochs for the whole run.
"""

from __future__ import annotations

from typing import Any

from ._result import LossMetrics


class TrainerHooks:
    """Empty hooks; override the ones you need in a ``Trainer`` subclass."""

    def on_train_start(self) -> None:
        """Called at the start of training (after the ``train_start`` callbacks)."""

    def on_train_end(
        self,
        train_losses: list[list[LossMetrics]],
        val_losses: list[list[LossMetrics]] | None = None,
    ) -> None:
        """Called at the end of training with every epoch's batch results."""

    def on_train_epoch_start(self) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self, train_epoch_loss_metrics: list[LossMetrics]) -> None:
        """Called at the end of each training epoch with its batches' ``(loss, metrics)``."""

    def on_val_epoch_start(self) -> None:
        """Called at the start of each validation after an epoch."""

    def on_val_epoch_end(self, val_epoch_loss_metrics: list[LossMetrics]) -> None:
        """Called at the end of each validation after an epoch."""

    def on_train_batch_start(self, batch: Any) -> None:
        """Called before each training step with its batch (on the device)."""

    def on_train_batch_end(self, train_batch_loss_metrics: LossMetrics) -> None:
        """Called after each training step with its ``(loss, metrics)``."""

    def on_val_batch_start(self, batch: Any) -> None:
        """Called before each validation batch."""

    def on_val_batch_end(self, val_batch_loss_metrics: LossMetrics) -> None:
        """Called after each validation batch with its ``(loss, metrics)``."""

    def on_test_batch_start(self, batch: Any) -> None:
        """Called before each test batch."""

    def on_test_batch_end(self, test_batch_loss_metrics: LossMetrics) -> None:
        """Called after each test batch with its ``(loss, metrics)``."""
