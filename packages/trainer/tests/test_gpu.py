"""The Trainer on one CUDA GPU: the DDP loop over nccl in one process, and the LM loop.

Skipped, saying why, where torch sees no CUDA device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import TrainConfig, Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here"),
]


def _loader(batch_size: int) -> DataLoader:  # type: ignore[type-arg]
    x = torch.linspace(-1, 1, 256).unsqueeze(1)
    return DataLoader(TensorDataset(x, torch.sinc(3 * x)), batch_size=batch_size)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))


def _full_loss(model: nn.Module) -> float:
    x = torch.linspace(-1, 1, 256).unsqueeze(1)
    device = next(model.parameters()).device
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x.to(device)).cpu(), torch.sinc(3 * x)))


def _config(tmp_path: Path, **kw: Any) -> TrainConfig:
    settings: dict[str, Any] = {"max_iter": 20, **kw}
    return TrainConfig(compute_setup="gpu", log_folder=tmp_path / "run", verbose=False, **settings)


def test_ddp_loop_over_nccl_in_one_process_trains_on_the_gpu(tmp_path: Path) -> None:
    model = _model()
    before = _full_loss(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    trained, _ = Trainer(model, optimizer, _config(tmp_path, backend="nccl"), loss_fn="mse").fit(
        _loader(32)
    )
    assert next(trained.parameters()).device.type == "cuda"
    assert _full_loss(trained) < 0.5 * before


def test_lm_loop_trains_on_the_gpu(tmp_path: Path) -> None:
    from marquardt.solver import LMA

    model = _model().cuda()
    before = _full_loss(model)
    lma = LMA(model, [torch.device("cuda", 0)], residual_fn=lambda a, b: a - b)
    trained, _ = Trainer(model, lma, _config(tmp_path, max_iter=5), loss_fn="mse").fit(_loader(128))
    assert next(trained.parameters()).device.type == "cuda"
    assert _full_loss(trained) < 0.2 * before  # 12 LM steps; 0.07x on the CPU
