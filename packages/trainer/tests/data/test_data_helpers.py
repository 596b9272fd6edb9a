"""``marquardt.trainer.data``: perceptrain's loaders and datasets, and a fit on named loaders
whose terms are logged one by one."""

from __future__ import annotations

import csv
import itertools
import pickle
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from marquardt.trainer import TrainConfig, Trainer
from marquardt.trainer._data._dict_loader import per_key_loss
from marquardt.trainer.data import (
    DictDataLoader,
    GenerativeIterableDataset,
    InfiniteTensorDataset,
    OptimizeResult,
    R3Dataset,
    to_dataloader,
)


def test_to_dataloader_finite_reads_every_row_once_in_order() -> None:
    x, y = torch.arange(10.0), torch.arange(10.0) * 2
    loader = to_dataloader(x, y, batch_size=4)
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    assert torch.equal(torch.cat([b[0] for b in batches]), x)
    assert torch.equal(torch.cat([b[1] for b in batches]), y)


def test_to_dataloader_infinite_cycles_a_seeded_permutation() -> None:
    x = torch.arange(6.0)
    loader = to_dataloader(x, x + 100, batch_size=2, infinite=True)
    random.seed(3)
    first = [b for b in itertools.islice(iter(loader), 6)]
    values = torch.cat([b[0] for b in first])
    assert sorted(values[:6].tolist()) == x.tolist()  # each pass is a permutation
    assert torch.equal(values[:6], values[6:])  # and the next pass repeats it
    assert all(torch.equal(b[1], b[0] + 100) for b in first)  # rows stay paired
    random.seed(3)  # the same seed gives a new loader the same order, as in perceptrain
    fresh = to_dataloader(x, x + 100, batch_size=2, infinite=True)
    again = torch.cat([b[0] for b in itertools.islice(iter(fresh), 3)])
    assert torch.equal(again, values[:6])
    with pytest.raises(ValueError, match=r"first dimension.*HINT"):
        InfiniteTensorDataset(torch.zeros(3), torch.zeros(4))


def test_r3_releases_the_unfit_points_and_redraws_only_those() -> None:
    draws = iter(range(100, 1000))

    def proba(n: int) -> torch.Tensor:
        return torch.tensor([[float(next(draws))] for _ in range(n)])

    dataset = R3Dataset(proba, n_samples=5, release_threshold=0.5)
    before = dataset.features.clone()
    assert len(dataset) == 5 and torch.equal(dataset[2], before[2])
    dataset.update(torch.tensor([0.9, 0.1, 0.7, 0.2, 0.5]))
    assert (dataset.n_released, dataset.n_retained) == (2, 3)
    kept = [0, 2, 4]
    assert torch.equal(dataset.features[kept], before[kept])
    assert dataset.features[[1, 3]].flatten().tolist() == [105.0, 106.0]
    dataset.update(torch.ones(5))
    assert dataset.n_released == 0
    with pytest.raises(ValueError, match=r"3 fitness values for 5 samples.*HINT"):
        dataset.update(torch.ones(3))
    with pytest.raises(ValueError, match=r"non-negative.*HINT"):
        R3Dataset(proba, n_samples=2, release_threshold=-1.0)


def test_generative_dataset_draws_once_per_item() -> None:
    counter = itertools.count()
    dataset = GenerativeIterableDataset(lambda: torch.tensor(float(next(counter))))
    assert [float(v) for v in itertools.islice(iter(dataset), 4)] == [0.0, 1.0, 2.0, 3.0]


def test_dict_loader_reads_its_loaders_together_until_the_first_ends() -> None:
    loader = DictDataLoader(
        {
            "pde": to_dataloader(torch.arange(6.0), batch_size=2),
            "boundary": to_dataloader(torch.arange(2.0), batch_size=1, infinite=True),
        }
    )
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    assert all(set(b) == {"pde", "boundary"} for b in batches)
    assert torch.equal(batches[2]["pde"][0], torch.tensor([4.0, 5.0]))
    shorter = DictDataLoader(
        {"a": to_dataloader(torch.zeros(4)), "b": to_dataloader(torch.zeros(2))}
    )
    assert len(list(shorter)) == 2
    iter(shorter)
    copy = pickle.loads(pickle.dumps(shorter))  # running iterators are not sent along
    assert len(list(copy)) == 2
    with pytest.raises(TypeError, match="before iter"):
        next(DictDataLoader({"a": to_dataloader(torch.zeros(2))}))


class _TwoTerms(torch.nn.Module):
    """A model of residuals by name, as perceptrain's PINN: u(x) − 1 and u(x) + 1."""

    def __init__(self) -> None:
        super().__init__()
        self.u = torch.nn.Linear(1, 1)

    def forward(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"up": self.u(batch["up"][0]) - 1.0, "down": self.u(batch["down"][0]) + 1.0}


class _OneTensor(torch.nn.Module):
    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        return torch.zeros(1)


def test_per_key_loss_sums_each_names_criterion_against_zero() -> None:
    model = _TwoTerms()
    batch = {"up": (torch.rand(4, 1),), "down": (torch.rand(3, 1),)}
    loss, metrics = per_key_loss(batch, model)
    out = model(batch)
    assert set(metrics) == {"up", "down"}
    assert float(metrics["up"]) == pytest.approx(float(out["up"].pow(2).mean()))
    assert float(loss) == pytest.approx(float(metrics["up"] + metrics["down"]))
    l1, _ = per_key_loss(batch, model, torch.nn.L1Loss())
    assert float(l1) == pytest.approx(float(out["up"].abs().mean() + out["down"].abs().mean()))
    with pytest.raises(TypeError, match=r"dict of residuals.*HINT"):
        per_key_loss(batch, _OneTensor())


def test_a_fit_on_named_loaders_logs_each_term(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _TwoTerms()
    loader = DictDataLoader(
        {
            "up": to_dataloader(torch.rand(12, 1), batch_size=4),
            "down": to_dataloader(torch.rand(8, 1), batch_size=4, infinite=True),
        }
    )
    config = TrainConfig(
        max_iter=3, root_folder=tmp_path, verbose=False, tracking_tool=["csv"], write_every=1
    )
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config, per_key_loss)
    trainer.fit(loader)
    result = trainer.opt_result
    assert isinstance(result, OptimizeResult) and result.iteration == 3
    assert float(result.metrics["train_loss"]) == pytest.approx(
        float(result.metrics["train_up"] + result.metrics["train_down"])
    )
    (path,) = tmp_path.glob("*/metrics.csv")
    rows = list(csv.DictReader(path.open()))
    assert {"train_up", "train_down", "train_loss"} <= set(rows[0])
    assert int(rows[0]["step"]) == 6  # 3 batches per epoch (the first loader's), epochs 0-1
