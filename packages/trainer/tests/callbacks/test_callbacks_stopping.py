"""``EarlyStopping`` in perceptrain's form (train_loss and val_loss, called_every, state in
checkpoints) and ``WallClockBudget`` as a callback bound to a stage, in real fits."""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import TrainConfig, Trainer
from marquardt.trainer._callbacks._base import Callback, CallbacksManager
from marquardt.trainer._callbacks._stopping import EarlyStopping, WallClockBudget
from marquardt.trainer._result import OptimizeResult
from marquardt.trainer._state import TrainerState


def _stand_in() -> Any:
    return SimpleNamespace(model=None, optimizer=None, opt_result=None, state=TrainerState())


def _feed(stopper: EarlyStopping, values: list[float], key: str = "val_loss") -> int | None:
    """Epochs 1.. with ``values`` at the callback's stage; the epoch the run was asked to stop."""
    trainer = _stand_in()
    manager = CallbacksManager([stopper], config=None, writer=None)
    for epoch, value in enumerate(values, start=1):
        trainer.opt_result = OptimizeResult(epoch, None, None, value, {key: torch.tensor(value)})
        manager.run_callbacks(trainer, stopper.on)
        if trainer.state.should_stop:
            return epoch
    return None


def test_perceptrain_form_with_called_every_counts_only_due_epochs() -> None:
    stopper = EarlyStopping(on="val_epoch_end", called_every=2, monitor="val_loss", patience=2)
    # Calls at epochs 2, 4, 6, 8: 1.0 (best), 1.0, 1.0 -> stop at 6; odd epochs are not seen.
    assert _feed(stopper, [5.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]) == 6
    assert (stopper.best_value, stopper.counter, stopper.stopped_at) == (1.0, 2, 6)


def test_strict_improvement_and_min_delta_and_max_mode() -> None:
    assert _feed(EarlyStopping(patience=1), [3.0, 3.0]) == 2  # equal is no improvement
    assert _feed(EarlyStopping(patience=1, min_delta=0.5), [3.0, 2.6]) == 2
    assert _feed(EarlyStopping(patience=1, min_delta=0.5), [3.0, 2.4, 1.8]) is None
    assert _feed(EarlyStopping(patience=2, mode="max"), [0.1, 0.2, 0.2, 0.1]) == 4
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=0)
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping(mode="up")
    with pytest.raises(ValueError, match="'on'"):
        EarlyStopping("val_loss")  # marquardt 0.2's positional monitor: loud, not silent


def test_a_missing_metric_names_the_metrics_there_are() -> None:
    with pytest.raises(ValueError, match=r"'train_loss' is not available.*\['val_loss'\].*HINT"):
        _feed(EarlyStopping(monitor="train_loss"), [1.0])


def test_state_survives_a_resume_and_decides_the_same_stop() -> None:
    values = [3.0, 2.0, 2.5, 2.4, 2.3, 2.2, 2.1]
    straight = _feed(EarlyStopping(patience=3), values)
    first = EarlyStopping(patience=3)
    assert _feed(first, values[:3]) is None
    second = EarlyStopping(patience=3)
    second.load_state_dict(first.state_dict())
    resumed_at = _feed(second, values[3:])
    assert straight == 5 and resumed_at is not None and resumed_at + 3 == straight
    assert EarlyStopping(monitor="val_acc", mode="max").state_key == (
        "EarlyStopping(monitor=val_acc, mode=max)"
    )
    with pytest.raises(ValueError, match="bad_validations"):
        EarlyStopping().load_state_dict({"best": 1.0})


def _fit(tmp_path: Path, callbacks: list[Callback], max_iter: int, **kw: Any) -> Trainer:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    x = torch.randn(24, 2)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    config = TrainConfig(
        max_iter=max_iter, root_folder=tmp_path, verbose=False, callbacks=callbacks, **kw
    )
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config, loss_fn="mse")
    trainer.fit(loader)
    return trainer


def test_train_loss_monitoring_stops_a_real_fit(tmp_path: Path) -> None:
    # An SGD rate this high makes the loss grow: the train_loss never improves on epoch 1.
    class Blow(Callback):
        def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
            for group in trainer.optimizer.param_groups:
                group["lr"] = 5.0

    stopper = EarlyStopping(on="train_epoch_end", called_every=1, monitor="train_loss", patience=2)
    trainer = _fit(tmp_path, [Blow(on="train_epoch_end", called_every=1), stopper], max_iter=50)
    assert stopper.stopped_at == 3
    assert trainer.state.should_stop and "no improvement in 'train_loss'" in (
        trainer.state.stop_reason
    )
    assert math.isfinite(stopper.best_value)


def test_wall_clock_budget_counts_from_the_runs_start_and_stops_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    slow = Callback(on="train_batch_end", callback=lambda *_: time.sleep(0.05))
    budget = WallClockBudget(seconds=0.3)
    trainer = _fit(tmp_path, [slow, budget], max_iter=1000, checkpoint_best_only=True)
    assert "wall-clock budget of 0.3 s spent" in trainer.state.stop_reason
    assert 1 <= trainer.state.current_epoch < 30
    assert trainer.state.last_checkpoint is not None and trainer.state.last_checkpoint.exists()
    with pytest.raises(ValueError, match=r"seconds must be a finite number > 0.*HINT"):
        WallClockBudget(seconds=0)
    with pytest.raises(ValueError, match=r"checked during training.*HINT"):
        WallClockBudget(seconds=1, on="train_start")


def test_wall_clock_budget_checks_every_call_of_its_stage_epoch_0_included() -> None:
    budget = WallClockBudget(seconds=0.05, on="train_epoch_end")
    trainer = _stand_in()
    trainer.opt_result = OptimizeResult(0, None, None)
    budget("train_epoch_end", trainer, None, None)  # outside fit: no clock, no stop
    assert not trainer.state.should_stop
    trainer.state.started_at = time.monotonic()
    budget("train_epoch_end", trainer, None, None)
    budget("train_batch_end", trainer, None, None)  # another stage: not its business
    assert not trainer.state.should_stop
    time.sleep(0.08)
    budget("train_batch_end", trainer, None, None)
    assert not trainer.state.should_stop
    budget("train_epoch_end", trainer, None, None)
    assert trainer.state.should_stop and trainer.state.checkpoint_requested
