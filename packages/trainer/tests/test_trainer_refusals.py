"""What the Trainer refuses before any work, each with what was asked, what was found and
a hint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from marquardt.testing.models import flat
from marquardt.trainer import ConfigError, LaunchError, Trainer, _compute
from marquardt.trainer.optimize_step import optimize_step

from .training import make_config, make_model, sinc_loader

pytestmark = pytest.mark.usefixtures("restore_use_grad")


def test_optimize_step_passed_in_the_old_position_is_explained(tmp_path: Path) -> None:
    model = make_model()
    with pytest.raises(ConfigError, match="pass optimize_step by keyword"):
        Trainer(
            model, torch.optim.SGD(model.parameters()), make_config(tmp_path), "mse", optimize_step
        )


def test_optimizer_of_another_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="parameter\\(s\\) that are not the model's"):
        Trainer(
            make_model(), torch.optim.SGD(make_model().parameters(), lr=0.1), make_config(tmp_path)
        )


def test_model_without_trainable_parameters_is_refused(tmp_path: Path) -> None:
    model = make_model().requires_grad_(False)
    with pytest.raises(ConfigError, match="has no trainable parameters"):
        Trainer(model, torch.optim.SGD(make_model().parameters(), lr=0.1), make_config(tmp_path))


def test_unknown_loss_and_lbfgs_accumulation_are_refused(tmp_path: Path) -> None:
    model = make_model()
    with pytest.raises(ConfigError, match="unknown loss name"):
        Trainer(model, torch.optim.SGD(model.parameters()), make_config(tmp_path), loss_fn="l1")
    with pytest.raises(ConfigError, match="accumulate_grad_batches > 1 with LBFGS"):
        Trainer(
            model,
            torch.optim.LBFGS(model.parameters()),
            make_config(tmp_path, accumulate_grad_batches=2),
        )


def test_empty_loader_is_refused_before_work(tmp_path: Path) -> None:
    model = make_model()
    before = flat(model)
    empty = DataLoader(TensorDataset(torch.zeros(0, 1), torch.zeros(0, 1)), batch_size=4)
    with pytest.raises(ConfigError, match="yields no batches"):
        Trainer(model, torch.optim.SGD(model.parameters()), make_config(tmp_path)).fit(empty)
    assert torch.equal(flat(model), before)


def test_gpu_setups_without_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_compute, "visible_gpu_count", lambda: 0)
    model = make_model()
    with pytest.raises(LaunchError, match=r"compute_setup='gpu'\) but no GPU.*HINT"):
        Trainer(
            model,
            torch.optim.SGD(model.parameters()),
            make_config(tmp_path, compute_setup="gpu", backend="nccl"),
        )
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters()),
        make_config(tmp_path, compute_setup="auto", backend="nccl", max_iter=0),
    )
    trainer.fit(sinc_loader())
    assert "replaced by 'gloo'" in capsys.readouterr().err


def test_batch_that_is_not_a_pair_is_explained(tmp_path: Path) -> None:
    model = make_model()
    loader = DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=4)
    with pytest.raises(TypeError, match=r"expected a batch \(inputs, targets\).*HINT"):
        Trainer(model, torch.optim.SGD(model.parameters()), make_config(tmp_path)).fit(loader)


def test_custom_optimize_step_without_grad_clip_is_refused(tmp_path: Path) -> None:
    def my_step(model: Any, optimizer: Any, loss_fn: Any, xs: Any, device: Any, dtype: Any) -> Any:
        return optimize_step(model, optimizer, loss_fn, xs, device, dtype)

    model = make_model()
    with pytest.raises(ConfigError, match="takes no grad_clip argument"):
        Trainer(
            model,
            torch.optim.SGD(model.parameters()),
            make_config(tmp_path, grad_clip=1.0),
            optimize_step=my_step,
        )
    Trainer(
        model,
        torch.optim.SGD(model.parameters()),
        make_config(tmp_path, max_iter=1),
        optimize_step=my_step,
    ).fit(sinc_loader())
