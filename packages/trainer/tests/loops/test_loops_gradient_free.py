"""Gradient-free training with nevergrad (``Trainer.set_use_grad(False)``): perceptrain's
count of asks and tells, a loss that goes down, the checkpointed optimizer, the errors."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import ConfigError, TrainConfig, Trainer
from marquardt.trainer._loops._gradient_free import (
    GradientFreeLoop,
    is_nevergrad_optimizer,
    require_nevergrad,
)
from marquardt.trainer._loss import resolve_loss
from marquardt.trainer._parameters import get_parameters, num_parameters, set_parameters
from marquardt.trainer.data import to_dataloader

ng = pytest.importorskip("nevergrad", reason="the nevergrad extra is not installed")


@pytest.fixture(autouse=True)
def _gradient_free() -> Iterator[None]:
    Trainer.set_use_grad(False)
    yield
    Trainer.set_use_grad(True)


def _problem(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    random.seed(seed)
    x = torch.randn(21, 2)
    return torch.nn.Linear(2, 1), x, x @ torch.tensor([[1.0], [-2.0]]) + 0.5


def _optimizer(model: torch.nn.Module, seed: int = 0) -> Any:
    optimizer = ng.optimizers.OnePlusOne(parametrization=num_parameters(model), budget=1000)
    optimizer.parametrization.random_state.seed(seed)
    return optimizer


def _mse(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


@pytest.mark.parametrize(("infinite", "tells"), [(False, 5 * 7), (True, 5)])
def test_one_ask_and_tell_per_batch_of_max_iter_plus_one_epochs(
    tmp_path: Path, infinite: bool, tells: int
) -> None:
    """perceptrain 0.1.0 gives 35 and 5 on this script (7 batches of 3, or one batch of an
    infinite loader, per epoch; epochs 0..4); its budget is set to max_iter."""
    model, x, y = _problem()
    optimizer = _optimizer(model)
    config = TrainConfig(max_iter=4, root_folder=tmp_path, verbose=False)
    loader = to_dataloader(x, y, batch_size=3, infinite=infinite)
    _, returned = Trainer(model, optimizer, config, loss_fn="mse").fit(loader)
    assert returned is optimizer
    assert (optimizer.num_tell, optimizer.num_ask, optimizer.budget) == (tells, tells, 4)
    assert optimizer.num_tell_not_asked == 1  # the model's initial parameters, told first


def test_the_loss_goes_down(tmp_path: Path) -> None:
    model, x, y = _problem()
    before = _mse(model, x, y)
    optimizer = _optimizer(model)
    config = TrainConfig(max_iter=150, root_folder=tmp_path, verbose=False)
    trainer = Trainer(model, optimizer, config, loss_fn="mse")
    trainer.fit(to_dataloader(x, y, batch_size=21, infinite=True))
    assert trainer.opt_result is not None
    assert float(trainer.opt_result.metrics["train_loss"]) < 0.2 * before
    set_parameters(model, torch.as_tensor(optimizer.recommend().value))
    assert _mse(model, x, y) < 0.1 * before


def test_a_custom_loss_and_no_data(tmp_path: Path) -> None:
    """perceptrain's loss_fn(batch, model) with batch None: the model holds its own problem."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    target = torch.tensor([1.0, -1.0, 2.0])

    def loss_fn(batch: Any, model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
        assert batch is None
        distance = (model.weight.flatten() - target).pow(2).sum()
        return distance, {"distance": distance}

    before = float(loss_fn(None, model)[0])
    optimizer = _optimizer(model)
    config = TrainConfig(max_iter=200, root_folder=tmp_path, verbose=False)
    trainer = Trainer(model, optimizer, config, loss_fn=loss_fn)
    trainer.fit()
    assert optimizer.num_tell == 201
    assert trainer.opt_result is not None
    assert float(trainer.opt_result.metrics["train_distance"]) < 0.1 * before


def test_the_checkpointed_optimizer_continues_the_same_sequence() -> None:
    model, x, y = _problem()
    loop = GradientFreeLoop(model, _optimizer(model), resolve_loss("mse"), _config())
    cpu = torch.device("cpu")
    batch = loop.prepare_batch((x, y), cpu)
    for _ in range(10):
        loop.step([batch], cpu)
    saved, weights = loop.state_dict(), {k: v.clone() for k, v in model.state_dict().items()}
    straight = [loop.step([batch], cpu).loss for _ in range(5)]

    other, _, _ = _problem(seed=1)
    resumed = GradientFreeLoop(other, _optimizer(other, seed=7), resolve_loss("mse"), _config())
    other.load_state_dict(weights)
    resumed.load_state_dict(saved)
    assert [resumed.step([batch], cpu).loss for _ in range(5)] == straight
    assert resumed.optimizer.num_tell == 15
    with pytest.raises(ConfigError, match="no nevergrad optimizer state"):
        resumed.load_state_dict({"optimizer": None})


def _config() -> TrainConfig:
    return TrainConfig(max_iter=20, verbose=False)


def test_errors_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, _ = _problem()
    assert is_nevergrad_optimizer(_optimizer(model))
    assert not is_nevergrad_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert not is_nevergrad_optimizer(ng.optimizers.OnePlusOne)  # the factory, not an optimizer
    wrong_size = ng.optimizers.OnePlusOne(parametrization=2, budget=10)
    with pytest.raises(ConfigError, match=r"dimension 2 but the model has 3.*HINT"):
        GradientFreeLoop(model, wrong_size, resolve_loss("mse"), _config())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"nevergrad.*HINT"):
        GradientFreeLoop(model, sgd, resolve_loss("mse"), _config())
    loop = GradientFreeLoop(model, _optimizer(model), resolve_loss("mse"), _config())
    with pytest.raises(ConfigError, match=r"one process, but this run has 2 \(torchrun\).*HINT"):
        loop.check_world("torchrun", 2)
    monkeypatch.setitem(sys.modules, "nevergrad", None)  # as if the extra were absent
    with pytest.raises(ConfigError, match=r"marquardt-trainer\[nevergrad\]"):
        require_nevergrad()


def test_get_and_set_parameters_round_trip_in_parameters_order() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    model[0].bias.requires_grad_(False)
    theta = get_parameters(model)
    assert theta.numel() == num_parameters(model) == 6 + 3 + 1
    new = torch.arange(10, dtype=torch.float64)
    set_parameters(model, new)
    assert torch.equal(model[0].weight.flatten(), torch.arange(6.0))
    assert torch.equal(model[1].bias, torch.tensor([9.0]))
    with pytest.raises(ValueError, match=r"got 4 values.*10 trainable.*HINT"):
        set_parameters(model, torch.zeros(4))


def test_a_loader_of_batches_in_a_real_fit_is_used_unchanged(tmp_path: Path) -> None:
    model, x, y = _problem()
    loader = DataLoader(TensorDataset(x, y), batch_size=7)
    seen: list[int] = []

    def loss_fn(batch: Any, model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
        seen.append(len(batch[0]))
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1]), {}

    config = TrainConfig(max_iter=1, root_folder=tmp_path, verbose=False, val_every=0)
    Trainer(model, _optimizer(model), config, loss_fn=loss_fn).fit(loader)
    assert seen == [7, 7, 7] * 2


def test_a_resumed_fit_ends_where_the_uninterrupted_one_does(tmp_path: Path) -> None:
    def fit(max_iter: int, folder: Path, resume: str | None) -> tuple[int, list[float]]:
        model, x, y = _problem()
        config = TrainConfig(
            max_iter=max_iter,
            root_folder=folder,
            verbose=False,
            checkpoint_every=2,
            resume_from=resume,
        )
        trainer = Trainer(model, _optimizer(model), config, loss_fn="mse")
        _, optimizer = trainer.fit(to_dataloader(x, y, batch_size=21, infinite=True))
        return optimizer.num_tell, get_parameters(model).tolist()

    fit(6, tmp_path / "split", None)
    resumed = fit(12, tmp_path / "split", "latest")
    straight = fit(12, tmp_path / "straight", None)
    assert resumed[0] == straight[0] == 13
    assert resumed[1] == straight[1]


def test_ngopt_either_trains_or_says_which_optimizer_to_use_instead() -> None:
    """nevergrad 1.0.12's NGOpt meta-model calls float() on a one-element array, which
    NumPy 2.4 refuses: a readable error naming the alternatives, never a bare TypeError."""
    model, x, y = _problem()
    optimizer = ng.optimizers.NGOpt(parametrization=num_parameters(model), budget=40)
    loop = GradientFreeLoop(model, optimizer, resolve_loss("mse"), _config())
    cpu = torch.device("cpu")
    batch = loop.prepare_batch((x, y), cpu)
    try:
        for _ in range(40):
            loop.step([batch], cpu)
    except ConfigError as error:
        assert "OnePlusOne or CMA" in str(error) and "HINT" in str(error)
    else:
        assert optimizer.num_tell == 40
