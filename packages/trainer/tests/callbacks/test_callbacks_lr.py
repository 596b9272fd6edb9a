"""perceptrain's learning-rate callbacks: when they run (epochs, ``called_every``), the rates
they set, their checkpointed state, and a real fit."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import ConfigError, TrainConfig, Trainer
from marquardt.trainer._callbacks._base import Callback, CallbacksManager
from marquardt.trainer._callbacks._lr_callbacks import (
    LRSchedulerCosineAnnealing,
    LRSchedulerCyclic,
    LRSchedulerReduceOnPlateau,
    LRSchedulerStepDecay,
)
from marquardt.trainer._result import OptimizeResult
from marquardt.trainer._state import TrainerState


def _trainer(lr: float = 1.0, groups: int = 1) -> Any:
    model = torch.nn.Linear(2, 1)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(
        [{"params": [p]} for p in params[:groups]] if groups > 1 else params, lr=lr
    )
    return SimpleNamespace(model=model, optimizer=optimizer, opt_result=None, state=TrainerState())


def _epochs(
    trainer: Any,
    callback: Callback,
    max_iter: int,
    metrics: list[float] | None = None,
    stage: str = "train_epoch_end",
) -> list[float]:
    """Epochs 0..max_iter as perceptrain runs them; the rate after each epoch's stage."""
    manager = CallbacksManager([callback], config=None, writer=None)
    rates = []
    for epoch in range(max_iter + 1):
        value = {} if metrics is None else {"train_loss": torch.tensor(metrics[epoch])}
        trainer.opt_result = OptimizeResult(epoch, trainer.model, trainer.optimizer, None, value)
        manager.run_callbacks(trainer, stage)
        rates.append(trainer.optimizer.param_groups[0]["lr"])
    return rates


def test_step_decay_runs_every_called_every_epochs_but_never_at_epoch_0() -> None:
    trainer = _trainer(lr=1.0)
    rates = _epochs(trainer, LRSchedulerStepDecay("train_epoch_end", called_every=3), max_iter=10)
    # Calls at epochs 3, 6, 9: the rate halves there and nowhere else.
    assert rates == [1.0] * 3 + [0.5] * 3 + [0.25] * 3 + [0.125] * 2
    again = _trainer(lr=1.0)
    bound_elsewhere = LRSchedulerStepDecay("val_epoch_end", called_every=1, gamma=0.1)
    assert _epochs(again, bound_elsewhere, max_iter=4) == [1.0] * 5


def test_cyclic_is_a_triangle_between_base_and_max() -> None:
    trainer = _trainer()
    callback = LRSchedulerCyclic("train_epoch_end", 1, base_lr=0.1, max_lr=0.5, step_size=4)
    rates = _epochs(trainer, callback, max_iter=12)
    expected = [0.1, 0.2, 0.3, 0.4, 0.5, 0.4, 0.3, 0.2, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert rates[1:] == pytest.approx(expected[1:])  # epoch 0 keeps the optimizer's rate
    assert rates[0] == 1.0
    with pytest.raises(ValueError, match="step_size"):
        LRSchedulerCyclic("train_epoch_end", 1, base_lr=0.1, max_lr=0.5, step_size=0)


def test_cosine_annealing_follows_the_cosine_from_each_groups_first_rate() -> None:
    trainer = _trainer(lr=1.0, groups=2)
    trainer.optimizer.param_groups[1]["lr"] = 0.5
    callback = LRSchedulerCosineAnnealing("train_epoch_end", 1, t_max=8, min_lr=0.1)
    _epochs(trainer, callback, max_iter=4)
    # At epoch 4 = t_max / 2, each group is halfway between its first rate and min_lr
    # (perceptrain's compounding of the current rate would give far less).
    first, second = (g["lr"] for g in trainer.optimizer.param_groups)
    assert first == pytest.approx(0.1 + 0.9 * 0.5) and second == pytest.approx(0.1 + 0.4 * 0.5)
    # The first rates travel in the checkpoint: a resumed callback continues the same curve.
    resumed = LRSchedulerCosineAnnealing("train_epoch_end", 1, t_max=8, min_lr=0.1)
    resumed.load_state_dict(callback.state_dict())
    trainer.opt_result = OptimizeResult(8, trainer.model, trainer.optimizer)
    resumed.run_callback(trainer, None, None)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([0.1, 0.1])
    assert math.isclose(callback.state_dict()["initial_lrs"][1], 0.5)
    with pytest.raises(ValueError, match=r"LRSchedulerCosineAnnealing\(t_max=0\).*HINT"):
        LRSchedulerCosineAnnealing("train_epoch_end", 1, t_max=0)


def test_reduce_on_plateau_reduces_after_patience_and_stops_at_min_lr() -> None:
    trainer = _trainer(lr=1.0)
    callback = LRSchedulerReduceOnPlateau(
        "train_epoch_end", monitor="train_loss", patience=2, gamma=0.5, min_lr=0.3
    )
    losses = [9.0, 5.0, 4.0, 4.0, 4.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    rates = _epochs(trainer, callback, max_iter=10, metrics=losses)
    # Epoch 0 is not a call. Improvements at 1, 2; plateau calls 3, 4 -> halve at 4;
    # improvement at 5; plateau 6, 7 -> 0.25 < min_lr, so 0.3 and no further change.
    assert rates == [1.0] * 4 + [0.5] * 3 + [0.3] * 4
    assert callback.reached_minimum_lr
    saved = callback.state_dict()
    fresh = LRSchedulerReduceOnPlateau("train_epoch_end", monitor="train_loss")
    fresh.load_state_dict(saved)
    assert (fresh.best_value, fresh.counter, fresh.reached_minimum_lr) == (3.0, 0, True)
    assert callback.state_key == "LRSchedulerReduceOnPlateau(monitor=train_loss, mode=min)"


def test_reduce_on_plateau_in_max_mode_counts_rising_values_as_improvements() -> None:
    trainer = _trainer(lr=1.0)
    callback = LRSchedulerReduceOnPlateau(
        "train_epoch_end", monitor="train_loss", patience=1, mode="max"
    )
    rates = _epochs(trainer, callback, max_iter=4, metrics=[0.0, 1.0, 2.0, 3.0, 4.0])
    assert rates == [1.0] * 5


def test_a_missing_metric_or_a_rateless_optimizer_is_a_clear_error() -> None:
    trainer = _trainer()
    trainer.opt_result = OptimizeResult(1, trainer.model, trainer.optimizer, None, {})
    plateau = LRSchedulerReduceOnPlateau("val_epoch_end", monitor="val_loss")
    with pytest.raises(ValueError, match=r"Metric 'val_loss' is not available.*HINT"):
        plateau.run_callback(trainer, None, None)
    trainer.optimizer = object()
    with pytest.raises(ConfigError, match=r"learning rate of a torch optimizer.*HINT"):
        LRSchedulerStepDecay("train_epoch_end", 1).run_callback(trainer, None, None)


def test_in_a_fit_step_decay_runs_once_per_due_epoch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    x = torch.randn(21, 2)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = TrainConfig(
        max_iter=9,
        root_folder=tmp_path,
        verbose=False,
        callbacks=[LRSchedulerStepDecay(on="train_epoch_end", called_every=4, gamma=0.5)],
    )
    Trainer(model, optimizer, config, loss_fn="mse").fit(loader)
    # Epochs 0..9 (3 batches each); calls at epochs 4 and 8.
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.25)
