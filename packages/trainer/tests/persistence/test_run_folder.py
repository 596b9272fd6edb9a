"""Run folders laid out as perceptrain lays them: ``model_<Model>_ckpt_<epoch>_device_<device>.pt``
and ``opt_<Optimizer>_ckpt_...`` beside the run's other files, the best one as
``..._ckpt_best_...``, in perceptrain's file format (``(epoch, state)`` and ``(epoch,
optimizer class, state)``), read back by ``load_checkpoint``. Each side loading the other's
files is checked against perceptrain itself in ``integration_tests/test_perceptrain_compat.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import (
    OptimizeResult,
    SaveBestCheckpoint,
    SaveCheckpoint,
    TrainConfig,
    Trainer,
    TrainingStage,
    load_checkpoint,
    write_checkpoint,
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))


def _loader() -> DataLoader[Any]:
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    return DataLoader(TensorDataset(x, torch.sin(3 * x)), batch_size=16)


def _pair_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".pt")


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_checkpoints_are_perceptrain_s_files_by_epoch_and_load_back(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    config = TrainConfig(max_iter=4, checkpoint_every=2, root_folder=tmp_path)
    Trainer(model, optimizer, config).fit(_loader())
    run = Path(config.log_folder)
    assert run.parent == tmp_path
    assert _pair_files(run) == [
        "model_Sequential_ckpt_002_device_cpu.pt",
        "model_Sequential_ckpt_004_device_cpu.pt",
        "opt_Adam_ckpt_002_device_cpu.pt",
        "opt_Adam_ckpt_004_device_cpu.pt",
    ]
    # perceptrain's format: what its loader unpacks (it loads with weights_only=False)
    epoch, state = torch.load(run / "model_Sequential_ckpt_004_device_cpu.pt", weights_only=False)
    assert epoch == 4 and set(state) == set(model.state_dict())
    epoch, cls, opt_state = torch.load(run / "opt_Adam_ckpt_004_device_cpu.pt", weights_only=False)
    assert (epoch, cls) == (4, torch.optim.Adam)
    assert opt_state["state"][0]["step"] == 10  # 5 epochs of 2 batches
    fresh = _model()
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.01)
    fresh.apply(lambda m: nn.init.zeros_(m.weight) if isinstance(m, nn.Linear) else None)
    loaded, loaded_optimizer, iteration = load_checkpoint(run, fresh, fresh_optimizer)
    assert iteration == 4 and loaded is fresh and loaded_optimizer is fresh_optimizer
    assert _same_weights(fresh, model)
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 10
    # the resume files stay in checkpoints/, by the optimizer step
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "ckpt_000000006.pt",
        "ckpt_000000010.pt",
    ]


def test_checkpoint_best_only_writes_the_one_best_pair(tmp_path: Path) -> None:
    model = _model()
    config = TrainConfig(
        max_iter=4,
        val_every=1,
        checkpoint_best_only=True,
        validation_criterion=lambda loss, best, eps: loss < best - eps,
        log_folder=tmp_path,
    )
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
    trainer.fit(_loader(), _loader())
    assert _pair_files(tmp_path) == [
        "model_Sequential_ckpt_best_device_cpu.pt",
        "opt_SGD_ckpt_best_device_cpu.pt",
    ]
    epoch, _ = torch.load(tmp_path / "model_Sequential_ckpt_best_device_cpu.pt", weights_only=True)
    assert epoch == "best"
    fresh = _model()
    fresh.apply(lambda m: nn.init.zeros_(m.weight) if isinstance(m, nn.Linear) else None)
    load_checkpoint(tmp_path, fresh, torch.optim.SGD(fresh.parameters(), lr=0.1))
    assert _same_weights(fresh, model)  # the loss fell every epoch: the last is the best


def test_save_checkpoint_called_by_hand_writes_the_pair_into_log_folder(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = TrainConfig(
        log_folder=tmp_path,
        validation_criterion=lambda loss, best, eps: loss < best - eps,
    )
    trainer = Trainer(model, optimizer, config)
    trainer.opt_result = OptimizeResult(iteration=7, model=model, optimizer=optimizer, loss=0.5)
    stage = TrainingStage.TRAIN_START
    SaveCheckpoint(on=stage)(stage, trainer, config, None)
    best = SaveBestCheckpoint(on=stage)
    best(stage, trainer, config, None)
    assert best.best_loss == 0.5
    assert _pair_files(tmp_path) == [
        "model_Sequential_ckpt_007_device_cpu.pt",
        "model_Sequential_ckpt_best_device_cpu.pt",
        "opt_SGD_ckpt_007_device_cpu.pt",
        "opt_SGD_ckpt_best_device_cpu.pt",
    ]


def test_an_optimizer_file_of_another_class_leaves_the_optimizer_as_it_is(
    tmp_path: Path,
) -> None:
    model = _model()
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(1, 1)).sum().backward()
    adam.step()
    write_checkpoint(tmp_path, model, adam, 3)
    fresh = _model()
    fresh.apply(lambda m: nn.init.zeros_(m.weight) if isinstance(m, nn.Linear) else None)
    sgd = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    before = sgd.state_dict()
    _, loaded, iteration = load_checkpoint(tmp_path, fresh, sgd)
    assert loaded is sgd and iteration == 3
    assert sgd.state_dict() == before  # as perceptrain: the model loads, the optimizer not
    assert _same_weights(fresh, model)
