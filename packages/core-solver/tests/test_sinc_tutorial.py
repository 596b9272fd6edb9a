"""The seed tutorial's loop: sinc(10x), batch 10000, slice 5000, a 1-64-1 tanh model.

The loop is the tutorial's (a shuffled DataLoader over 100000 points, ``lma.step(x, y,
slice_size)`` per batch) with Nielsen's damping and Marquardt's scaling. It must reach a
full-dataset MSE below 1e-5 within a bounded number of epochs, without losing a single
attempt to a failed Cholesky factorisation (the factorisation is float64).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.solver import LMA

MAX_EPOCHS = 30


def test_seed_loop_reaches_mse_below_1e_5() -> None:
    torch.manual_seed(0)
    x_train = torch.linspace(-1, 1, 100000, dtype=torch.float32).unsqueeze(1)
    y_train = torch.sinc(10 * x_train)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=10000, shuffle=True)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 1))
    lma = LMA(
        model, [torch.device("cpu")], lambda a, b: a - b, damping="nielsen", scaling="marquardt"
    )

    rejections: list[str] = []
    mse = float("inf")
    for _ in range(MAX_EPOCHS):
        for x, y in loader:
            _, terminated = lma.step(x, y, 5000)
            assert not terminated
            assert lma.report is not None
            rejections += lma.report.rejections
        with torch.no_grad():
            mse = float(((model(x_train) - y_train) ** 2).mean())
        if mse < 1e-5:
            break
    assert mse < 1e-5, f"full-dataset MSE {mse:.3e} after {MAX_EPOCHS} epochs"
    assert "cholesky failed" not in rejections
