"""``R3Sampling``: an ``R3Dataset`` updated from the model's fitness at epoch starts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from marquardt.trainer import TrainConfig, Trainer
from marquardt.trainer._callbacks._base import TrainingStage
from marquardt.trainer._callbacks._sampling import R3Sampling
from marquardt.trainer.data import R3Dataset


def _uniform(n: int) -> torch.Tensor:
    return torch.rand(n, 1)


def test_an_update_redraws_the_points_below_the_threshold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(0)
    dataset = R3Dataset(_uniform, n_samples=50, release_threshold=0.5)
    before = dataset.features.clone()
    callback = R3Sampling(dataset, lambda x, model: x.squeeze(1), verbose=True)
    assert callback.on is TrainingStage.TRAIN_EPOCH_START
    callback.run_callback(SimpleNamespace(model=None, current_epoch=3), None, None)
    kept = before.squeeze(1) >= 0.5
    assert dataset.n_released == int((~kept).sum()) > 0
    assert torch.equal(dataset.features[kept], before[kept])
    assert "Epoch 3;" in capsys.readouterr().out


def test_in_a_fit_the_dataset_moves_at_epoch_starts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    dataset = R3Dataset(_uniform, n_samples=16, release_threshold=0.5)
    calls: list[int] = []

    def fitness(x: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        calls.append(1)
        with torch.no_grad():
            return model(x).squeeze(1).abs()

    def loss_fn(batch: Any, model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
        return model(batch).pow(2).mean(), {}

    model = torch.nn.Linear(1, 1)
    config = TrainConfig(
        max_iter=4, root_folder=tmp_path, verbose=False, callbacks=[R3Sampling(dataset, fitness)]
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    Trainer(model, optimizer, config, loss_fn=loss_fn).fit(DataLoader(dataset, batch_size=8))
    assert len(calls) == 3  # epochs 2, 3, 4 start after epochs 1-3 (perceptrain: 3 too)
    assert dataset.n_released + dataset.n_retained == 16
