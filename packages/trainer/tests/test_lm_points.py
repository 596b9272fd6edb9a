"""The Trainer's LM loop with residuals that differentiate the model by its inputs: an
``LMA`` built on a ``PointResidual`` (dense or matrix-free) trains from a shuffled
``DataLoader`` over the batch that ``PointResidual.batch`` builds (1-D Poisson, −u'' = π² sin(πx), u(0) = u(1) = 0)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import TrainConfig, Trainer


@pytest.mark.parametrize("strategy", ["auto", "matrix_free"])
def test_lm_loop_trains_a_point_residual_from_shuffled_batches(
    tmp_path: Path, strategy: str
) -> None:
    from marquardt.jacobian import PointResidual, ResidualGroup
    from marquardt.solver import LMA

    def pde(u, x, f):  # type: ignore[no-untyped-def]
        return -torch.func.hessian(u)(x).reshape(()) - f

    def boundary(u, x, _g):  # type: ignore[no-untyped-def]
        return u(x)

    residual = PointResidual(ResidualGroup("pde", pde), ResidualGroup("boundary", boundary))
    inner = torch.linspace(0, 1, 22, dtype=torch.float64)[1:-1, None]
    x, y = residual.batch(
        pde=(inner, math.pi**2 * torch.sin(math.pi * inner[:, 0])),
        boundary=torch.tensor([[0.0], [1.0]], dtype=torch.float64),
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    test = torch.linspace(0, 1, 101, dtype=torch.float64)[:, None]

    def error() -> float:
        with torch.no_grad():
            exact = torch.sin(math.pi * test[:, 0])
            return float((model(test)[:, 0] - exact).norm() / exact.norm())

    before = error()
    loader = DataLoader(TensorDataset(x, y), batch_size=len(x), shuffle=True)
    lma = LMA(model, [torch.device("cpu")], residual, strategy=strategy)
    Trainer(model, lma, TrainConfig(max_iter=24, root_folder=tmp_path)).fit(loader)  # 25 epochs
    assert lma.steps == 25
    assert lma.report is not None and lma.report.strategy == (
        "matrix_free" if strategy == "matrix_free" else "explicit"  # N = 22 < P = 25
    )
    assert error() < 0.05 * before
