"""The seed tutorial's loop: sinc(10x), batch 10000, slice 5000, a 1-64-1 tanh model.

The loop is the tutorial's (shuffled batches of 10000 of the 100000 points each epoch,
``lma.step(x, y, slice_size)`` per batch) with Nielsen's damping and Marquardt's scaling.
It must reach a full-dataset MSE below 1e-5 within a bounded number of epochs, without
losing a single attempt to a failed Cholesky factorisation (the factorisation is float64).

Two things keep it fast without changing what it proves. The loader yields the same
batches as ``DataLoader(..., batch_size=10000, shuffle=True)`` (the same ``BatchSampler``
over a ``RandomSampler``) but gathers each batch with one index instead of collating
10000 single samples, which cost more than the LM step itself. And the loop runs on one
torch thread: on a shared 2-core machine two OpenMP threads per kernel wait on each other
at every barrier, which made each step of this small model about 30× slower (12 ms on
one thread against 380 ms on two, measured here at load 4); the iterates do not depend
on speed, only on rounding, and this loop converges either way. The full-dataset MSE is
evaluated when the batch loss says it may be below the threshold, and after every epoch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from marquardt.solver import LMA
from marquardt.testing.threads import torch_threads

MAX_EPOCHS = 30
THRESHOLD = 1e-5


@pytest.fixture
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.mark.usefixtures("one_thread")
def test_seed_loop_reaches_mse_below_1e_5() -> None:
    torch.manual_seed(0)
    x_train = torch.linspace(-1, 1, 100000, dtype=torch.float32).unsqueeze(1)
    y_train = torch.sinc(10 * x_train)
    dataset = TensorDataset(x_train, y_train)
    batches = BatchSampler(RandomSampler(dataset), batch_size=10000, drop_last=False)
    loader = DataLoader(dataset, sampler=batches, batch_size=None)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 1))
    lma = LMA(
        model, [torch.device("cpu")], lambda a, b: a - b, damping="nielsen", scaling="marquardt"
    )

    def full_mse() -> float:
        with torch.no_grad():
            return float(((model(x_train) - y_train) ** 2).mean())

    rejections: list[str] = []
    steps = 0
    mse = float("inf")
    for _ in range(MAX_EPOCHS):
        for x, y in loader:
            loss, terminated = lma.step(x, y, 5000)
            steps += 1
            assert not terminated
            assert lma.report is not None
            rejections += lma.report.rejections
            # The batch is a tenth of the data: its loss is an estimate of the full MSE.
            if loss < 2 * THRESHOLD and (mse := full_mse()) < THRESHOLD:
                break
        else:
            mse = full_mse()
        if mse < THRESHOLD:
            break
    assert mse < THRESHOLD, f"full-dataset MSE {mse:.3e} after {steps} steps ({MAX_EPOCHS} epochs)"
    assert "cholesky failed" not in rejections
