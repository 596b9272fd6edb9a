"""``EarlyStopping`` and ``WallClockBudget``, marquardt-trainer's own stopping callbacks.

Callbacks run in every training process, so a callback that stops training takes the same
decision everywhere; the trainer also combines ``should_stop`` across processes each step,
so one process asking to stop is enough. ``EarlyStopping`` keeps the state that decides
its next stop (best value, validations without improvement) in every checkpoint, so a
resumed run stops where the uninterrupted one would.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from ._base import Callback, TrainingStage


class EarlyStopping(Callback):
    """Stop when a validation metric has not improved for ``patience`` validations.

    Bound to ``val_epoch_end`` by default (``on``, ``called_every`` as any callback); the
    metric is read from ``trainer.opt_result.metrics`` (``val_loss``, ``val_<metric>``).

    An improvement is a value below ``best - min_delta`` (``mode="min"``) or above
    ``best + min_delta`` (``mode="max"``). Every process sees the same validation metrics
    (each validates the whole validation loader), so every process stops at the same step.
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        patience: int = 3,
        min_delta: float = 0.0,
        mode: str = "min",
        *,
        on: str | TrainingStage = "val_epoch_end",
        called_every: int = 1,
    ) -> None:
        super().__init__(on=on, called_every=called_every)
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(
                f"EarlyStopping(patience={patience!r}): patience must be a whole number >= 1. "
                "HINT: the number of validations without improvement to tolerate, e.g. 3"
            )
        if mode not in ("min", "max"):
            raise ValueError(
                f"EarlyStopping(mode={mode!r}): mode must be 'min' or 'max'. "
                "HINT: 'min' for losses, 'max' for accuracies"
            )
        if not math.isfinite(min_delta) or min_delta < 0:
            raise ValueError(
                f"EarlyStopping(min_delta={min_delta!r}): min_delta must be finite and >= 0. "
                "HINT: the smallest change that counts as an improvement, e.g. 1e-4"
            )
        self.monitor = monitor
        self.patience = patience
        self.min_delta = float(min_delta)
        self.mode = mode
        self.best: float | None = None
        self.bad_validations = 0
        self.stopped_at: int | None = None

    @property
    def state_key(self) -> str:
        return f"EarlyStopping(monitor={self.monitor}, mode={self.mode})"

    def state_dict(self) -> dict[str, Any]:
        """``best``, ``bad_validations`` and ``stopped_at``: what decides the next stop."""
        return {
            "best": self.best,
            "bad_validations": self.bad_validations,
            "stopped_at": self.stopped_at,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = sorted({"best", "bad_validations"} - set(state))
        if missing:
            raise ValueError(
                f"EarlyStopping.load_state_dict: the state has no {', '.join(missing)} (found "
                f"{sorted(state)}). HINT: pass what EarlyStopping.state_dict() returned"
            )
        best = state["best"]
        self.best = None if best is None else float(best)
        self.bad_validations = int(state["bad_validations"])
        stopped_at = state.get("stopped_at")
        self.stopped_at = None if stopped_at is None else int(stopped_at)

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        metrics = trainer.opt_result.metrics
        if self.monitor not in metrics:
            raise KeyError(
                f"EarlyStopping monitors {self.monitor!r} but the stage {self.on.value!r} produced "
                f"{sorted(metrics)}. HINT: monitor one of those names"
            )
        value = float(metrics[self.monitor])
        if self._improved(value):
            self.best = value
            self.bad_validations = 0
            return
        self.bad_validations += 1
        if self.bad_validations >= self.patience:
            self.stopped_at = trainer.state.current_epoch
            trainer.state.should_stop = True
            trainer.state.stop_reason = (
                f"early stopping: {self.monitor} did not improve for {self.patience} validations "
                f"(best {self.best:.6g})"
            )


class WallClockBudget(Callback):
    """Stop, with a checkpoint, once this invocation of ``fit`` has trained ``seconds``.

    The clock starts at ``train_start`` (``trainer.state.started_at``) (after any resume), so a requeued job gets its
    budget afresh; the check is made after each step, so leave the length of a step (and
    of writing a checkpoint) as a margin below a scheduler's hard limit. Every rank checks
    its own clock and one rank asking is enough: every rank stops at the same step, and the
    checkpoint is written even with ``checkpoint_best_only``.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(on="train_batch_end")
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
        self.seconds = float(seconds)

    def _should_call(self, when: TrainingStage, opt_result: Any) -> bool:
        """After every training batch, epoch 0's too: the budget counts every second."""
        return True

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        started = trainer.state.started_at
        if started is None or time.monotonic() - started < self.seconds:
            return
        state = trainer.state
        state.should_stop = True
        state.checkpoint_requested = True
        state.stop_reason = state.stop_reason or (f"wall-clock budget of {self.seconds:g} s spent")
