"""The loss forms a ``Trainer`` accepts, turned into ``loss_fn(batch, model)`` once; and
perceptrain's checkpoint helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.trainer import ConfigError, load_checkpoint, load_model, write_checkpoint
from marquardt.trainer._loss import CriterionLoss, resolve_loss

BATCH = (torch.linspace(-1, 1, 8).unsqueeze(1), torch.zeros(8, 1))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(1, 1)


def _expected(model: nn.Module) -> torch.Tensor:
    return nn.functional.mse_loss(model(BATCH[0]), BATCH[1])


def by_name(batch: Any, model: nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
    return _expected(model), {"n": 8}


def by_annotation(data: Any, net: nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
    return _expected(net), {}


def criterion(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return ((outputs - targets) ** 2).mean()


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("mse", False),
        (nn.MSELoss(), False),
        (criterion, False),
        (lambda out, target: ((out - target) ** 2).mean(), False),
        (by_name, True),
        (by_annotation, True),
    ],
)
def test_every_form_becomes_batch_and_model(given: Any, kept: bool) -> None:
    loss_fn = resolve_loss(given)
    assert (loss_fn is given) == kept and isinstance(loss_fn, CriterionLoss) != kept
    model = _model()
    loss, metrics = loss_fn(BATCH, model)
    assert torch.equal(loss, _expected(model)) and isinstance(metrics, dict)
    assert resolve_loss(loss_fn) is loss_fn  # resolving twice changes nothing (a spawn does)


def test_a_criterion_without_a_batch_is_explained_and_bad_names_refused() -> None:
    with pytest.raises(TypeError, match=r"there is no data.*HINT"):
        resolve_loss("mse")(None, _model())
    with pytest.raises(ConfigError, match="unknown loss name"):
        resolve_loss("l2")
    with pytest.raises(ConfigError, match="expected a name or a function"):
        resolve_loss(3)


def test_perceptrain_s_checkpoint_helpers_round_trip(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    _expected(model).backward()
    optimizer.step()
    for epoch in (2, 10):
        write_checkpoint(tmp_path, model, optimizer, epoch)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "model_Linear_ckpt_002_device_cpu.pt",
        "model_Linear_ckpt_010_device_cpu.pt",
        "opt_Adam_ckpt_002_device_cpu.pt",
        "opt_Adam_ckpt_010_device_cpu.pt",
    ]
    fresh = nn.Linear(1, 1)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
    loaded, loaded_opt, iteration = load_checkpoint(tmp_path, fresh, fresh_opt)
    assert iteration == 10 and loaded is fresh and loaded_opt is fresh_opt
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)
    )
    assert fresh_opt.state_dict()["state"][0]["step"] == 1
    assert load_model(tmp_path / "nothing", nn.Linear(1, 1))[1] == 0
    assert load_checkpoint(tmp_path / "new", fresh, fresh_opt)[2] == 0
    assert (tmp_path / "new").is_dir()
