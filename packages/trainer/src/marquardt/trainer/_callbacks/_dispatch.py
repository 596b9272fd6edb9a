"""``StageDispatch``: the trainer entering a stage, in perceptrain's order.

At a stage's start the trainer's hook method runs (``on_train_epoch_start()``), then the
callbacks bound to the stage. At its end the stage's ``OptimizeResult`` is built (one
batch's loss and metrics, or their mean over the epoch), the callbacks bound to the end
run, then the hook method with the stage's results (``on_train_epoch_end(results)``). The
runner calls this object; it never sees the ``Trainer`` whose hooks and ``opt_result``
this sets, so the loops stay apart from the facade.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._result import LossMetrics, OptimizeResult, epoch_mean
from .._state import TrainerState
from ._base import CallbacksManager, TrainingStage


class StageDispatch:
    """Hooks of ``owner`` (a ``Trainer``) and the manager's callbacks, stage by stage."""

    def __init__(self, owner: Any, manager: CallbacksManager, state: TrainerState) -> None:
        self.owner = owner
        self.manager = manager
        self.state = state

    def hook(self, name: str, *args: Any) -> None:
        """The owner's hook method ``name`` (a subclass's override, or the empty default)."""
        method = getattr(self.owner, name, None)
        if method is not None:
            method(*args)

    def start(self, stage: TrainingStage) -> None:
        """Enter ``stage`` and run its callbacks (``opt_result`` is left as it is)."""
        self.owner.training_stage = stage
        self.manager.run_callbacks(self.owner, stage)

    def end(self, stage: TrainingStage, results: LossMetrics | Sequence[LossMetrics]) -> None:
        """Enter ``stage`` with its results as ``opt_result`` and run its callbacks."""
        self.owner.training_stage = stage
        if isinstance(results, tuple):
            loss, metrics = results
        else:
            loss, metrics = epoch_mean(list(results))
        self.owner.opt_result = self.result(loss, metrics)
        self.manager.run_callbacks(self.owner, stage)

    def result(self, loss: Any, metrics: dict[str, Any]) -> OptimizeResult:
        """An ``OptimizeResult`` of the current epoch."""
        state = self.state
        return OptimizeResult(
            iteration=state.current_epoch,
            model=self.owner.model,
            optimizer=getattr(self.owner, "_run_optimizer", self.owner.optimizer),
            loss=loss,
            metrics=metrics,
            rank=state.rank,
            device=str(state.device),
        )

    def stop_requested(self) -> bool:
        """Whether a callback asked to stop (``trainer._stop_training.fill_(1)``)."""
        flag = getattr(self.owner, "_stop_training", None)
        return bool(isinstance(flag, torch.Tensor) and int(flag.max()) > 0)

    def idle(self) -> None:
        self.owner.training_stage = TrainingStage.IDLE
