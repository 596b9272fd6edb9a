"""Callbacks that stop training: perceptrain's ``EarlyStopping`` and our ``WallClockBudget``.

Both ask for the stop through ``trainer.state`` (``should_stop``, with the reason the run
reports). Callbacks run in every training process and the trainer combines the requests
over the processes, so every process stops after the same epoch (or batch).

``EarlyStopping`` keeps what decides its next stop (the best value and the calls since it)
in every checkpoint, under a key naming its ``monitor`` and ``mode``, so a resumed run
stops where the uninterrupted one would. ``WallClockBudget`` measures each call of
``fit`` afresh (a requeued job gets its budget again): it has nothing to keep.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from marquardt.devices._whole import is_whole

from ._base import Callback, TrainingStage, check_mode

logger = logging.getLogger("marquardt.trainer")


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved for ``patience`` calls.

    perceptrain's callback: it runs at ``on`` every ``called_every`` epochs and reads
    ``trainer.opt_result.metrics[monitor]``; ``"val_loss"`` (or any ``val_*`` metric) at
    ``val_epoch_end``, ``"train_loss"`` (or ``train_*``) at ``train_epoch_end``, where
    ``train_loss`` is the epoch's mean loss. A value improves when it is below the best so
    far by more than ``min_delta`` (``mode="min"``), or above it (``mode="max"``);
    ``min_delta`` is ours, and 0 (the default) is perceptrain's rule. After ``patience``
    calls without an improvement the run stops at the end of the current epoch.

    Arguments:
        on: the stage it runs at (default ``"val_epoch_end"``).
        called_every: run every that many epochs.
        monitor: the metric of ``trainer.opt_result.metrics`` watched.
        patience: calls without an improvement before the run stops (>= 1).
        mode: ``"min"`` (lower is better) or ``"max"``.
        min_delta: the change by more than which a value improves on the best (>= 0).

    Raises:
        ValueError: ``on`` is not a stage, ``called_every`` is not a whole number >= 0,
            ``patience`` not one >= 1, ``mode`` neither ``"min"`` nor ``"max"``, or
            ``min_delta`` not finite and >= 0.
    """

    def __init__(
        self,
        on: str | TrainingStage = "val_epoch_end",
        called_every: int = 1,
        monitor: str = "val_loss",
        patience: int = 5,
        mode: str = "min",
        *,
        min_delta: float = 0.0,
    ) -> None:
        super().__init__(on=on, called_every=called_every)
        if not is_whole(patience, 1):
            raise ValueError(
                f"EarlyStopping(patience={patience!r}): patience must be a whole number >= 1. "
                "HINT: the number of calls without improvement to tolerate, e.g. 5"
            )
        check_mode("EarlyStopping", mode)
        if not math.isfinite(min_delta) or min_delta < 0:
            raise ValueError(
                f"EarlyStopping(min_delta={min_delta!r}): min_delta must be finite and >= 0. "
                "HINT: the smallest change that counts as an improvement, e.g. 1e-4"
            )
        self.monitor = monitor
        self.patience = patience
        self.mode = mode
        self.min_delta = float(min_delta)
        self.best_value = self._start
        self.counter = 0
        #: The epoch at which this callback stopped the run (``None``: it has not).
        self.stopped_at: int | None = None

    @property
    def state_key(self) -> str:
        return f"EarlyStopping(monitor={self.monitor}, mode={self.mode})"

    def _improved(self, value: float) -> bool:
        if self.mode == "min":
            return value < self.best_value - self.min_delta
        return value > self.best_value + self.min_delta

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        metrics = trainer.opt_result.metrics
        value = metrics.get(self.monitor)
        if value is None:
            raise ValueError(
                f"Metric '{self.monitor}' is not available in the trainer's metrics (the stage "
                f"{self.on.value!r} produced {sorted(metrics)}). HINT: monitor one of those, or "
                "bind the callback where the metric is computed: on='val_epoch_end' for val_*, "
                "on='train_epoch_end' for train_*"
            )
        value = float(value)
        if self._improved(value):
            self.best_value = value
            self.counter = 0
            return
        self.counter += 1
        if self.counter < self.patience:
            return
        self.stopped_at = int(trainer.opt_result.iteration)
        reason = (
            f"early stopping: no improvement in '{self.monitor}' for {self.patience} calls "
            f"(best {self.best_value:.6g})"
        )
        logger.info(reason)
        state = trainer.state
        state.should_stop = True
        state.stop_reason = state.stop_reason or reason
        flag = getattr(trainer, "_stop_training", None)
        if flag is not None:  # perceptrain's request, which its callbacks and scripts read
            flag.fill_(1)

    @property
    def best(self) -> float | None:
        """The best value so far, ``None`` before the first call (marquardt-trainer 0.2's name)."""
        return None if math.isinf(self.best_value) else self.best_value

    @best.setter
    def best(self, value: float | None) -> None:
        self.best_value = float(value) if value is not None else self._start

    @property
    def bad_validations(self) -> int:
        """The calls since the last improvement (``counter``; marquardt-trainer 0.2's name)."""
        return self.counter

    @bad_validations.setter
    def bad_validations(self, value: int) -> None:
        self.counter = int(value)

    @property
    def _start(self) -> float:
        return math.inf if self.mode == "min" else -math.inf

    def state_dict(self) -> dict[str, Any]:
        """``best``, ``bad_validations`` and ``stopped_at``: what decides the next stop.

        The keys of marquardt-trainer 0.2, so its checkpoints resume with this callback.
        """
        return {
            "best": self.best,
            "bad_validations": self.counter,
            "stopped_at": self.stopped_at,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = sorted({"best", "bad_validations"} - set(state))
        if missing:
            raise ValueError(
                f"EarlyStopping.load_state_dict: the state has no {', '.join(missing)} (found "
                f"{sorted(state)}). HINT: pass what EarlyStopping.state_dict() returned"
            )
        self.best = state["best"]
        self.counter = int(state["bad_validations"])
        stopped_at = state.get("stopped_at")
        self.stopped_at = None if stopped_at is None else int(stopped_at)


class WallClockBudget(Callback):
    """Stop, with a checkpoint, once this call of ``fit`` has trained ``seconds``.

    The clock is the run's: ``trainer.state.started_at``, set when training starts (after
    any resume), so a requeued job gets its budget afresh. It is checked at every ``on``
    (each training batch by default, epoch 0 included: ``called_every`` does not apply),
    so leave the length of a batch (and of writing a checkpoint) as a margin below a
    scheduler's hard limit. One process asking is enough: every process stops at the same
    batch, and the checkpoint is written even with ``checkpoint_best_only``.

    Arguments:
        seconds: the budget, in seconds of training in this call of ``fit``.
        on: the stage it is checked at (default ``"train_batch_end"``).

    Raises:
        ValueError: ``seconds`` is not a finite number > 0, or ``on`` is not a stage, or is
            ``"idle"`` or ``"train_start"``.
    """

    def __init__(self, seconds: float, on: str | TrainingStage = "train_batch_end") -> None:
        super().__init__(on=on)
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise ValueError(
                f"WallClockBudget(seconds={seconds!r}): seconds must be a finite number > 0. "
                "HINT: e.g. WallClockBudget(seconds=3.5 * 3600) for a 4-hour job"
            )
        if self.on in (TrainingStage.IDLE, TrainingStage.TRAIN_START):
            raise ValueError(
                f"WallClockBudget(on={self.on.value!r}): the budget is checked during "
                "training. HINT: on='train_batch_end' (the default) or on='train_epoch_end'"
            )
        self.seconds = float(seconds)

    def _should_call(self, when: TrainingStage, opt_result: Any) -> bool:
        """At every call of its stage, epoch 0's too: the budget counts every second."""
        return True

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        state = trainer.state
        if state.started_at is None or time.monotonic() - state.started_at < self.seconds:
            return
        state.should_stop = True
        state.checkpoint_requested = True
        state.stop_reason = state.stop_reason or f"wall-clock budget of {self.seconds:g} s spent"
