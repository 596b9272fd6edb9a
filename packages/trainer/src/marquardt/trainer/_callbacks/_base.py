"""``Callback``, the stages it runs at, and the ``CallbacksManager`` that runs them.

perceptrain's callback model: a callback is bound to one ``TrainingStage`` (``on``)
and runs every ``called_every`` epochs there. The trainer enters a stage, builds its
``OptimizeResult`` (the epoch's mean loss and metrics at ``train_epoch_end``, one batch's
at ``train_batch_end``, ...) and asks the manager to run the callbacks bound to it, in
order, with ``(trainer, config, writer)``. At ``train_start`` and ``train_end`` a
callback always runs; elsewhere it runs when the result's ``iteration`` (the epoch) is a
positive multiple of ``called_every`` and ``callback_condition(opt_result)`` holds, so
nothing but ``train_start`` runs at epoch 0, the evaluation before any update.

Our addition: a callback whose later decisions depend on what it saw (counters, best
values) returns that from ``state_dict()``; the trainer stores it in every checkpoint
under ``state_key`` and gives it back on resume, so a resumed run decides as the
uninterrupted one would (``marquardt.trainer._persistence._callback_state``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

from marquardt.devices._whole import is_whole

#: A callback function: ``fn(trainer, config, writer)``.
CallbackFunction = Callable[..., Any]
#: A condition on the ``OptimizeResult``: ``cond(opt_result) -> bool``.
CallbackConditionFunction = Callable[..., bool]


class TrainingStage(str, Enum):
    """Where the trainer is: the stage a callback is bound to (``Callback(on=...)``)."""

    IDLE = "idle"
    TRAIN_START = "train_start"
    TRAIN_END = "train_end"
    TRAIN_EPOCH_START = "train_epoch_start"
    TRAIN_EPOCH_END = "train_epoch_end"
    TRAIN_BATCH_START = "train_batch_start"
    TRAIN_BATCH_END = "train_batch_end"
    VAL_EPOCH_START = "val_epoch_start"
    VAL_EPOCH_END = "val_epoch_end"
    VAL_BATCH_START = "val_batch_start"
    VAL_BATCH_END = "val_batch_end"
    TEST_BATCH_START = "test_batch_start"
    TEST_BATCH_END = "test_batch_end"

    def __str__(self) -> str:
        return str(self.value)


#: The stages a callback may be bound to by name (``"idle"`` binds it to none).
VALID_ON_VALUES = [stage.value for stage in TrainingStage]


def _always(_: Any) -> bool:
    return True


def _unchanged(opt_result: Any) -> Any:
    return opt_result


def check_mode(who: str, mode: str) -> None:
    """Refuse a monitoring ``mode`` other than ``"min"`` or ``"max"``.

    **Arguments:**

    - ``who``: the callback class that was given ``mode``, for the message.
    - ``mode``: the mode it was given.
    """
    if mode not in ("min", "max"):
        raise ValueError(
            f"{who}(mode={mode!r}): mode must be 'min' or 'max'. HINT: 'min' for losses, "
            "'max' for accuracies"
        )


class Callback:
    """Run ``callback(trainer, config, writer)`` (or ``run_callback``) at the stage ``on``.

    Either pass ``callback=fn`` or subclass and override ``run_callback``; what it returns
    is what the manager returns for it.

    State: override ``state_dict`` / ``load_state_dict`` when the callback keeps state
    that decides what it does later. The state must be made of ``None``, ``bool``,
    ``int``, ``float``, ``str``, tensors, and lists, tuples and ``str``-keyed dicts of
    those (what ``torch.load(weights_only=True)`` reads back).

    Arguments:
        on: a ``TrainingStage`` or its name (``"train_epoch_end"``, ...); ``"idle"`` (the
            default) binds it to none.
        called_every: run every that many epochs (0: never, but at ``train_start`` and
            ``train_end``, where a callback always runs).
        callback: ``fn(trainer, config, writer)``, what the callback does.
        callback_condition: ``cond(opt_result) -> bool``: run only when it is true.
        modify_optimize_result: a function ``opt_result -> opt_result`` applied before the
            check, or a dict merged into ``opt_result.extra``.

    Raises:
        ValueError: ``on`` is not a stage, or ``called_every`` is not a whole number >= 0.
    """

    VALID_ON_VALUES = VALID_ON_VALUES

    def __init__(
        self,
        on: str | TrainingStage = "idle",
        called_every: int = 1,
        callback: CallbackFunction | None = None,
        callback_condition: CallbackConditionFunction | None = None,
        modify_optimize_result: CallbackFunction | dict[str, Any] | None = None,
    ) -> None:
        if not is_whole(called_every, 0):
            raise ValueError(
                f"{type(self).__name__}(called_every={called_every!r}): called_every must be a "
                "whole number >= 0. HINT: the period in epochs, e.g. called_every=5; 0 turns "
                "the callback off but at train_start and train_end"
            )
        self.on = on
        self.called_every = called_every
        self.callback = callback
        self.callback_condition = callback_condition or _always
        if isinstance(modify_optimize_result, dict):
            extra = dict(modify_optimize_result)

            def merge(opt_result: Any) -> Any:
                opt_result.extra.update(extra)
                return opt_result

            self.modify_optimize_result: CallbackFunction = merge
        else:
            self.modify_optimize_result = modify_optimize_result or _unchanged

    @property
    def on(self) -> TrainingStage:
        """The stage this callback runs at."""
        return self._on

    @on.setter
    def on(self, on: str | TrainingStage) -> None:
        if isinstance(on, TrainingStage):
            self._on = on
        elif isinstance(on, str) and on in VALID_ON_VALUES:
            self._on = TrainingStage(on)
        else:
            raise ValueError(
                f"Invalid value for 'on'. Must be one of {VALID_ON_VALUES}. (got "
                f"{type(self).__name__}(on={on!r})) HINT: e.g. on='train_epoch_end'"
            )

    def _should_call(self, when: TrainingStage, opt_result: Any) -> bool:
        """Always at the start and end of training; else every ``called_every`` epochs > 0."""
        if when in (TrainingStage.TRAIN_START, TrainingStage.TRAIN_END):
            return True
        iteration = 0 if opt_result is None else opt_result.iteration
        if self.called_every == 0 or iteration == 0:
            return False
        return iteration % self.called_every == 0 and bool(self.callback_condition(opt_result))

    def __call__(self, when: str | TrainingStage, trainer: Any, config: Any, writer: Any) -> Any:
        """Run the callback if it is bound to ``when`` and due; return what it returns."""
        if self.on != when:
            return None
        opt_result = getattr(trainer, "opt_result", None)
        if opt_result is not None:
            opt_result = self.modify_optimize_result(opt_result)
        if self._should_call(TrainingStage(when), opt_result):
            return self.run_callback(trainer, config, writer)
        return None

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        """What the callback does; by default calls ``callback(trainer, config, writer)``."""
        if self.callback is not None:
            return self.callback(trainer, config, writer)
        raise NotImplementedError(
            f"{type(self).__name__}: pass callback=fn(trainer, config, writer) or override "
            "run_callback(self, trainer, config, writer)"
        )

    # -------------------------------------------------------- checkpointed state
    @property
    def state_key(self) -> str:
        """The name this callback's state is stored under in a checkpoint.

        The class's qualified name by default. When several callbacks of a run share a
        key, the second is stored as ``"<key> #2"``, and so on.
        """
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """The state a resumed run needs (empty: nothing to checkpoint)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what ``state_dict`` returned (called on resume, before training)."""


#: The argument lists of a callback that does its own work (``run_callback`` overridden,
#: ``Callback``'s constructor kept), added to its docstring by ``with_lists``.
OWN_WORK_LISTS = """
Arguments:
    on: the stage it runs at, as for `Callback` (default ``"idle"``: none).
    called_every: run every that many epochs, as for `Callback`.
    callback: not used: this class's own ``run_callback`` runs.
    callback_condition: run only when ``callback_condition(opt_result)`` holds.
    modify_optimize_result: as for `Callback`.

Raises:
    ValueError: ``on`` is not a stage, or ``called_every`` is not a whole number >= 0.
"""


class CallbacksManager:
    """The run's callbacks (the configuration's built-ins, then the user's), run by stage.

    Arguments:
        callbacks: the callbacks, in the order they run at a stage.
        config: the run's ``TrainConfig``, passed to every callback.
        writer: the run's writer (its logger), passed to every callback.
    """

    def __init__(self, callbacks: Iterable[Callback], config: Any, writer: Any) -> None:
        self.callbacks = list(callbacks)
        self.config = config
        self.writer = writer

    def add_callback(
        self, callback: Callback, on: str | TrainingStage, called_every: int = 1
    ) -> None:
        """Bind ``callback`` to ``on`` every ``called_every`` epochs and append it."""
        callback.on = on
        callback.called_every = called_every
        self.callbacks.append(callback)

    def run_callbacks(self, trainer: Any, stage: str | TrainingStage | None = None) -> list[Any]:
        """Run the callbacks bound to ``stage`` (default: ``trainer.training_stage``)."""
        when = TrainingStage(stage if stage is not None else trainer.training_stage)
        return [
            callback(when, trainer, self.config, self.writer)
            for callback in self.callbacks
            if callback.on == when
        ]
