"""Callbacks: user code run at fixed points of the loop; ``EarlyStopping``, ``WallClockBudget``.

Callbacks run in every training process (so a callback that stops training takes the same
decision everywhere; the trainer also combines ``should_stop`` across processes each step,
so one process asking to stop is enough). ``trainer.state`` gives the step, the epoch, the
rank and the latest metrics; a callback that writes files should check
``trainer.state.is_global_zero``.

A callback that keeps state across steps (``EarlyStopping``'s best value and count of
validations without improvement) returns it from ``state_dict()`` and takes it back in
``load_state_dict()``; the trainer stores it in every checkpoint under the callback's
``state_key``, so a resumed run decides exactly as the uninterrupted one would
(:mod:`marquardt.trainer._persistence._callback_state` has the rule for a callback list
that changed).

Hooks receive the running ``Trainer`` (in a spawned process, the one built there); they
are typed with :class:`RunningTrainer`, the protocol the ``Trainer`` satisfies (its ``state``), so
this module depends on nothing above it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .._state import TrainerState


class RunningTrainer(Protocol):
    """What a hook may rely on in the object it receives: the run's :class:`TrainerState`."""

    @property
    def state(self) -> TrainerState: ...


class Callback:
    """Base class: override the hooks you need; each receives the running ``Trainer``.

    Order within a step: ``on_batch_start`` → optimizer or LM step → ``on_batch_end``
    (with the step's loss and metrics) → validation hooks when due → checkpoint.

    State: override ``state_dict`` / ``load_state_dict`` when the callback keeps state that
    decides what it does later (counters, best values). The state must be made of
    ``None``, ``bool``, ``int``, ``float``, ``str``, tensors, and lists, tuples and
    ``str``-keyed dicts of those (what ``torch.load(weights_only=True)`` reads back).
    """

    @property
    def state_key(self) -> str:
        """The name this callback's state is stored under in a checkpoint.

        The class's qualified name by default; a callback whose configuration changes what
        its state means (``EarlyStopping``'s ``monitor``) adds it. When several callbacks
        of a run share a key, the second is stored as ``"<key> #2"``, and so on.
        """
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """The state a resumed run needs (empty: nothing to checkpoint)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what [`state_dict`][marquardt.trainer.Callback.state_dict] returned (called on resume, before training)."""

    def on_train_start(self, trainer: RunningTrainer) -> None:
        """Before the first step (after any resume)."""

    def on_train_end(self, trainer: RunningTrainer) -> None:
        """After the last step and the final checkpoint."""

    def on_epoch_start(self, trainer: RunningTrainer, epoch: int) -> None:
        """Before the first batch of ``epoch`` (0-based)."""

    def on_epoch_end(self, trainer: RunningTrainer, epoch: int) -> None:
        """After the last batch of ``epoch``."""

    def on_batch_start(self, trainer: RunningTrainer, batch: Any) -> None:
        """Before the step that will consume ``batch``."""

    def on_batch_end(self, trainer: RunningTrainer, loss: float, metrics: dict[str, float]) -> None:
        """After the step; ``trainer.state.step`` already counts it."""

    def on_validation_start(self, trainer: RunningTrainer) -> None:
        """Before a validation pass."""

    def on_validation_end(self, trainer: RunningTrainer, metrics: dict[str, float]) -> None:
        """After a validation pass; ``metrics`` holds ``val_loss`` and the other ``val_*``."""


class EarlyStopping(Callback):
    """Stop when a validation metric has not improved for ``patience`` validations.

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
    ) -> None:
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

    def on_validation_end(self, trainer: RunningTrainer, metrics: dict[str, float]) -> None:
        if self.monitor not in metrics:
            raise KeyError(
                f"EarlyStopping monitors {self.monitor!r} but validation produced "
                f"{sorted(metrics)}. HINT: monitor one of those names"
            )
        value = float(metrics[self.monitor])
        if self._improved(value):
            self.best = value
            self.bad_validations = 0
            return
        self.bad_validations += 1
        if self.bad_validations >= self.patience:
            self.stopped_at = trainer.state.step
            trainer.state.should_stop = True
            trainer.state.stop_reason = (
                f"early stopping: {self.monitor} did not improve for {self.patience} validations "
                f"(best {self.best:.6g})"
            )


class WallClockBudget(Callback):
    """Stop, with a checkpoint, once this invocation of ``fit`` has trained ``seconds``.

    The clock starts at ``on_train_start`` (after any resume), so a requeued job gets its
    budget afresh; the check is made after each step, so leave the length of a step (and
    of writing a checkpoint) as a margin below a scheduler's hard limit. Every rank checks
    its own clock and one rank asking is enough: every rank stops at the same step, and the
    checkpoint is written even with ``checkpoint_best_only``.
    """

    def __init__(self, seconds: float) -> None:
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
        self._started: float | None = None

    def on_train_start(self, trainer: RunningTrainer) -> None:
        self._started = time.monotonic()

    def on_batch_end(self, trainer: RunningTrainer, loss: float, metrics: dict[str, float]) -> None:
        if self._started is None or time.monotonic() - self._started < self.seconds:
            return
        state = trainer.state
        state.should_stop = True
        state.checkpoint_requested = True
        state.stop_reason = state.stop_reason or (f"wall-clock budget of {self.seconds:g} s spent")


class Hooks:
    """The run's callbacks, called in order with the object they are given as ``trainer``."""

    def __init__(self, callbacks: Sequence[Callback], owner: RunningTrainer) -> None:
        self.callbacks = list(callbacks)
        self.owner = owner

    def __call__(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self.owner, *args)
