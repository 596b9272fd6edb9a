"""perceptrain's learning-rate callbacks: step decay, cyclic, cosine annealing, plateau.

Each sets ``lr`` in every param group of ``trainer.optimizer`` (a torch optimizer) when it
runs, that is at its stage ``on`` every ``called_every`` epochs; ``t`` below is the epoch
(``trainer.opt_result.iteration``):

- ``LRSchedulerStepDecay``: lr ← γ·lr at each call.
- ``LRSchedulerCyclic``: the triangular cycle of Smith 2017 ("Cyclical learning rates
  for training neural networks"), lr = base + (max − base)·max(0, 1 − |t/s − 2⌊t/2s⌋ − 1|),
  from ``base_lr`` at t = 0 up to ``max_lr`` at t = s and back, period 2s.
- ``LRSchedulerCosineAnnealing``: Loshchilov & Hutter 2017 (SGDR), lr = min + (lr₀ −
  min)·(1 + cos(π t / T)) / 2, lr₀ the group's rate at the first call. perceptrain takes
  the group's *current* rate for lr₀ at every call, so its rates shrink by the product of
  the factors, faster than the cosine it documents; here they follow the cosine.
- ``LRSchedulerReduceOnPlateau``: lr ← max(γ·lr, ``min_lr``) after ``patience``
  calls without an improvement of the monitored metric by more than ``threshold``; once a
  group reaches ``min_lr`` the callback stops. With ``mode="max"`` the first value counts
  as an improvement (perceptrain starts from +∞ in both modes, so a maximised metric never
  improves there and the rate falls every ``patience`` calls).

The optimizer's rates are saved with it in every checkpoint; the callbacks whose later
rates depend on what they saw (the first rates, the best value, the count since it) keep
that in ``state_dict``, so a resumed run sets the same rates as the uninterrupted one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from .._errors import ConfigError
from ._base import Callback, TrainingStage, check_mode

logger = logging.getLogger("marquardt.trainer")


def _require_positive(owner: Callback, name: str, value: float, meaning: str, example: str) -> None:
    """``ValueError`` (before any work) unless ``value``, a number of epochs, is > 0."""
    if value <= 0:
        raise ValueError(
            f"{type(owner).__name__}({name}={value!r}): {meaning} must be > 0 epochs. "
            f"HINT: e.g. {example}"
        )


def _param_groups(trainer: Any, who: str) -> list[dict[str, Any]]:
    """The torch optimizer's param groups, or a ``ConfigError`` naming the optimizer found."""
    groups = getattr(trainer.optimizer, "param_groups", None)
    if groups is None:
        raise ConfigError(
            f"{who} sets the learning rate of a torch optimizer, but the trainer's optimizer "
            f"is a {type(trainer.optimizer).__name__}, which has none. HINT: use it with a "
            "torch.optim optimizer; an LMA's step is set by its damping, and nevergrad has no "
            "learning rate"
        )
    return list(groups)


def _metric(trainer: Any, monitor: str) -> float:
    """The monitored metric of ``trainer.opt_result`` (perceptrain's ``ValueError`` if absent)."""
    metrics = trainer.opt_result.metrics
    value = metrics.get(monitor)
    if value is None:
        raise ValueError(
            f"Metric '{monitor}' is not available in the trainer's metrics (found "
            f"{sorted(metrics)}). HINT: monitor one of those, bound to a stage that computes "
            "it (train_loss at train_epoch_end, val_loss at val_epoch_end)"
        )
    return float(value)


class LRSchedulerStepDecay(Callback):
    """Multiply every group's learning rate by ``gamma`` at each call.

    Arguments:
        on: the stage it runs at, as for `Callback`.
        called_every: run every that many epochs, as for `Callback`.
        gamma: the factor.

    Raises:
        ValueError: ``on`` is not a stage, or ``called_every`` is not a whole number >= 0.
    """

    def __init__(self, on: str | TrainingStage, called_every: int, gamma: float = 0.5) -> None:
        super().__init__(on=on, called_every=called_every)
        self.gamma = gamma

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        for group in _param_groups(trainer, type(self).__name__):
            group["lr"] *= self.gamma


class LRSchedulerCyclic(Callback):
    """A triangular cycle between ``base_lr`` and ``max_lr``, ``step_size`` epochs each way.

    Arguments:
        on: the stage it runs at, as for `Callback`.
        called_every: run every that many epochs, as for `Callback`.
        base_lr: the rate at the bottom of the cycle (epoch 0).
        max_lr: the rate at the top of the cycle (epoch ``step_size``).
        step_size: the half-cycle, in epochs.

    Raises:
        ValueError: ``on`` is not a stage, or ``called_every`` is not a whole number >= 0, or ``step_size`` is not > 0.
    """

    def __init__(
        self,
        on: str | TrainingStage,
        called_every: int,
        base_lr: float,
        max_lr: float,
        step_size: int,
    ) -> None:
        super().__init__(on=on, called_every=called_every)
        _require_positive(self, "step_size", step_size, "the half-cycle", "step_size=2000")
        self.base_lr = base_lr
        self.max_lr = max_lr
        self.step_size = step_size

    def rate(self, iteration: int) -> float:
        """The learning rate at ``iteration``."""
        cycle = iteration // (2 * self.step_size)
        x = abs(iteration / self.step_size - 2 * cycle - 1)
        return self.base_lr + (self.max_lr - self.base_lr) * max(0.0, 1.0 - x)

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        lr = self.rate(trainer.opt_result.iteration)
        for group in _param_groups(trainer, type(self).__name__):
            group["lr"] = lr


class LRSchedulerCosineAnnealing(Callback):
    """Anneal each group's rate from its first value to ``min_lr`` along a cosine of ``t_max``.

    Arguments:
        on: the stage it runs at, as for `Callback`.
        called_every: run every that many epochs, as for `Callback`.
        t_max: the annealing length ``T``, in epochs.
        min_lr: the rate at the end of the annealing.

    Raises:
        ValueError: ``on`` is not a stage, or ``called_every`` is not a whole number >= 0, or ``t_max`` is not > 0.
    """

    def __init__(
        self, on: str | TrainingStage, called_every: int, t_max: int, min_lr: float = 0.0
    ) -> None:
        super().__init__(on=on, called_every=called_every)
        _require_positive(self, "t_max", t_max, "the annealing length", "t_max=max_iter")
        self.t_max = t_max
        self.min_lr = min_lr
        self.initial_lrs: list[float] | None = None

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        groups = _param_groups(trainer, type(self).__name__)
        if self.initial_lrs is None or len(self.initial_lrs) != len(groups):
            self.initial_lrs = [float(group["lr"]) for group in groups]
        factor = (1.0 + math.cos(math.pi * trainer.opt_result.iteration / self.t_max)) / 2.0
        for group, lr0 in zip(groups, self.initial_lrs, strict=True):
            group["lr"] = self.min_lr + (lr0 - self.min_lr) * factor

    def state_dict(self) -> dict[str, Any]:
        """The groups' first rates (the top of the cosine)."""
        return {} if self.initial_lrs is None else {"initial_lrs": list(self.initial_lrs)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        lrs = state.get("initial_lrs")
        self.initial_lrs = None if lrs is None else [float(v) for v in lrs]


class LRSchedulerReduceOnPlateau(Callback):
    """Multiply the rates by ``gamma`` after ``patience`` calls without improving ``monitor``.

    Arguments:
        on: the stage it runs at, as for `Callback`.
        called_every: run every that many epochs, as for `Callback`.
        monitor: the metric of ``trainer.opt_result.metrics`` watched.
        patience: calls without an improvement before the rates fall.
        mode: ``"min"`` (lower is better) or ``"max"``.
        gamma: the factor on the rates.
        threshold: the change by more than which a value improves on the best.
        min_lr: the lowest rate; once a group reaches it the callback stops.
        verbose: log each change of rate (``logging``, at INFO).

    Raises:
        ValueError: ``on`` is not a stage, or ``called_every`` is not a whole number >= 0, or ``mode`` is neither ``"min"`` nor ``"max"``.
    """

    def __init__(
        self,
        on: str | TrainingStage,
        called_every: int = 1,
        monitor: str = "train_loss",
        patience: int = 20,
        mode: str = "min",
        gamma: float = 0.5,
        threshold: float = 1e-4,
        min_lr: float = 1e-6,
        verbose: bool = True,
    ) -> None:
        super().__init__(on=on, called_every=called_every)
        check_mode(type(self).__name__, mode)
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.gamma = gamma
        self.threshold = threshold
        self.min_lr = min_lr
        self.verbose = verbose
        self.best_value = math.inf if mode == "min" else -math.inf
        self.counter = 0
        self.reached_minimum_lr = False

    @property
    def state_key(self) -> str:
        return f"{type(self).__qualname__}(monitor={self.monitor}, mode={self.mode})"

    def _improved(self, value: float) -> bool:
        if self.mode == "min":
            return value + self.threshold < self.best_value
        return value - self.threshold > self.best_value

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        if self.reached_minimum_lr:
            return
        value = _metric(trainer, self.monitor)
        if self._improved(value):
            self.best_value = value
            self.counter = 0
        else:
            self.counter += 1
        if self.counter < self.patience:
            return
        for group in _param_groups(trainer, type(self).__name__):
            lr = group["lr"] * self.gamma
            if lr < self.min_lr:
                lr = self.min_lr
                self.reached_minimum_lr = True
            group["lr"] = lr
            if self.verbose:
                logger.info(
                    f"{self.monitor} reached a plateau: learning rate set to {lr:g}"
                    + (" (the minimum)" if self.reached_minimum_lr else "")
                )
        self.counter = 0

    def state_dict(self) -> dict[str, Any]:
        """The best value, the calls since it, and whether the minimum rate was reached."""
        return {
            "best_value": self.best_value,
            "counter": self.counter,
            "reached_minimum_lr": self.reached_minimum_lr,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best_value = float(state["best_value"])
        self.counter = int(state["counter"])
        self.reached_minimum_lr = bool(state["reached_minimum_lr"])
