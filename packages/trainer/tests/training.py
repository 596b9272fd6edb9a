"""The small fit most Trainer tests train: sinc(3x) on 64 points in [-1, 1], a 1-8-1 tanh
network, batches of 8, a TrainConfig that writes every epoch into a temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import TrainConfig
from marquardt.trainer._persistence import _files as ckpt


def sinc_data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(-1, 1, n).unsqueeze(1)
    return x, torch.sinc(3 * x)


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))


def sinc_loader(batch_size: int = 8, shuffle: bool = False, n: int = 64) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(TensorDataset(*sinc_data(n)), batch_size=batch_size, shuffle=shuffle)


def full_loss(model: nn.Module) -> float:
    x, y = sinc_data()
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


def make_config(tmp_path: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "max_iter": 3,
        "log_folder": tmp_path,
        "verbose": False,
        "seed": 0,
        "write_every": 1,
    }
    base.update(kw)
    return TrainConfig(**base)


def batch_loss(batch: Any, model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x, y = batch
    error = model(x) - y
    return (error**2).mean(), {"mae": error.abs().mean()}


def checkpoint_steps(run: Path) -> list[int]:
    return [s for s, _ in ckpt.list_checkpoints(run / ckpt.CHECKPOINT_DIR)]
