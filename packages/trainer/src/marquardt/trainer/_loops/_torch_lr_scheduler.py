"""LR schedulers: stepped per epoch or per optimizer step, ``ReduceLROnPlateau`` per validation.

A torch LR scheduler scales the learning rate η_t of its optimizer on a schedule (step
decay, cosine, ...); ``ReduceLROnPlateau`` multiplies η by ``factor`` when the monitored
validation metric has not improved for ``patience`` validations. The scheduler's state is
saved in every checkpoint and restored on resume, so the learning rate of a resumed run
follows the uninterrupted run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._config import TrainConfig
from .._errors import ConfigError


def is_plateau(scheduler: Any) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def check_scheduler(scheduler: Any, optimizer: Any, config: TrainConfig) -> None:
    """A torch scheduler of this optimizer; a plateau scheduler needs validation."""
    if scheduler is None:
        return
    kinds = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if not isinstance(scheduler, kinds):
        raise ConfigError(
            f"Trainer(scheduler=...): expected a torch.optim.lr_scheduler scheduler, got "
            f"{type(scheduler).__name__}. HINT: e.g. torch.optim.lr_scheduler.StepLR(optimizer, "
            "step_size=10)"
        )
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise ConfigError(
            f"Trainer(scheduler=...): the {type(scheduler).__name__} was built for another "
            "optimizer. HINT: build it from the optimizer given to the Trainer"
        )
    if is_plateau(scheduler) and not config.val_every:
        raise ConfigError(
            f"ReduceLROnPlateau watches the validation metric {config.scheduler_monitor!r} but "
            "TrainConfig.val_every is 0 (no validation). HINT: set val_every and pass "
            "fit(val_loader=...) or fit(val_dataset=...)"
        )


class LRSchedule:
    """The run's scheduler (or none), stepped at the points the configuration names."""

    def __init__(self, scheduler: Any, config: TrainConfig) -> None:
        self.scheduler = scheduler
        self.interval = config.scheduler_interval
        self.monitor = config.scheduler_monitor

    def after_step(self) -> None:
        self._step_at("step")

    def after_epoch(self) -> None:
        self._step_at("epoch")

    def _step_at(self, interval: str) -> None:
        """Step the scheduler when ``interval`` is its (a plateau one steps on validation)."""
        scheduler = self.scheduler
        if scheduler is not None and self.interval == interval and not is_plateau(scheduler):
            scheduler.step()

    def after_validation(self, metrics: Mapping[str, float]) -> None:
        if self.scheduler is None or not is_plateau(self.scheduler):
            return
        if self.monitor not in metrics:
            raise ConfigError(
                f"ReduceLROnPlateau monitors {self.monitor!r} but validation produced "
                f"{sorted(metrics)}. HINT: set TrainConfig.scheduler_monitor to one of those"
            )
        self.scheduler.step(metrics[self.monitor])

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.scheduler is None else dict(self.scheduler.state_dict())

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        if self.scheduler is not None and state is not None:
            self.scheduler.load_state_dict(dict(state))
