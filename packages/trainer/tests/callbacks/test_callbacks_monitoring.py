"""``GradientMonitoring``: perceptrain's gradient statistics per parameter, written by the
run's writer at the epochs its ``called_every`` names."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import TrainConfig, Trainer
from marquardt.trainer._callbacks._monitoring import GradientMonitoring, gradient_statistics
from marquardt.trainer._result import OptimizeResult


def test_statistics_are_those_of_each_gradient() -> None:
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    model(torch.randn(5, 3)).pow(2).sum().backward()
    stats = gradient_statistics(model)
    grad = model.weight.grad
    assert grad is not None
    assert set(stats) == {"weight_mean", "weight_std", "weight_max", "weight_min"}
    assert stats["weight_mean"] == pytest.approx(float(grad.mean()))
    assert stats["weight_std"] == pytest.approx(float(grad.std()))
    assert (stats["weight_max"], stats["weight_min"]) == (float(grad.max()), float(grad.min()))


def test_a_fit_writes_them_at_the_due_epochs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    x = torch.randn(24, 2)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    config = TrainConfig(
        max_iter=7,
        root_folder=tmp_path,
        verbose=False,
        tracking_tool=["csv"],
        callbacks=[GradientMonitoring(on="train_epoch_end", called_every=3)],
    )
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config, loss_fn="mse").fit(loader)
    (path,) = tmp_path.glob("*/metrics.csv")
    rows = [r for r in csv.DictReader(path.open()) if r.get("weight_mean")]
    assert [int(r["epoch"]) for r in rows] == [3, 6]
    assert all(float(r["weight_max"]) >= float(r["weight_min"]) for r in rows)
    assert {"bias_mean", "bias_std", "bias_max", "bias_min"} <= set(rows[0])


def test_nothing_is_written_when_no_parameter_has_a_gradient() -> None:
    written: list[Any] = []
    writer = SimpleNamespace(write=lambda iteration, metrics: written.append((iteration, metrics)))
    model = torch.nn.Linear(2, 1)
    trainer = SimpleNamespace(model=model, opt_result=OptimizeResult(2, model, None))
    monitor = GradientMonitoring(on="train_epoch_end", called_every=1)
    monitor.run_callback(trainer, None, writer)
    assert written == []
    model(torch.ones(1, 2)).sum().backward()
    monitor.run_callback(trainer, None, writer)
    assert [i for i, _ in written] == [2] and set(written[0][1]) >= {"weight_mean", "bias_min"}
