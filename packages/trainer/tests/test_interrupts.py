"""Ctrl-C at random moments inside ``Trainer.fit`` (the gradient loop and the LM loop, one
process): the caller sees KeyboardInterrupt every time, and the run leaves no
half-written file, only checkpoints that load, and the process as it was (grad mode, the
SIGTERM handler)."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.testing.interrupts import interrupt_repeatedly
from marquardt.trainer import TrainConfig, Trainer
from marquardt.trainer._persistence import _files as ckpt

TRIALS = 30


def _loader(dtype: torch.dtype = torch.float32) -> DataLoader:  # type: ignore[type-arg]
    x = torch.linspace(-1, 1, 64, dtype=dtype).unsqueeze(1)
    return DataLoader(TensorDataset(x, torch.sin(3 * x)), batch_size=16)


def _gradient_run(folder: Path) -> tuple[Trainer, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    config = TrainConfig(max_iter=24, root_folder=folder, create_subfolder_per_run=True,
                         checkpoint_every=4, verbose=False)  # fmt: skip
    return Trainer(model, torch.optim.Adam(model.parameters(), lr=1e-2), config), _loader()


def _lm_run(folder: Path) -> tuple[Trainer, Any]:
    pytest.importorskip("marquardt.solver", reason="the LM loop needs marquardt-solver")
    from marquardt.solver import LMA

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    config = TrainConfig(max_iter=12, root_folder=folder, create_subfolder_per_run=True,
                         checkpoint_every=3, verbose=False)  # fmt: skip
    lma = LMA(model, ["cpu"], residual_fn=torch.sub)
    return Trainer(model, lma, config), _loader(torch.float64)


@pytest.mark.parametrize("build", [_gradient_run, _lm_run], ids=["gradient", "lm"])
def test_interrupts_inside_fit_stay_interrupts(tmp_path: Path, build: Any) -> None:
    sigterm = signal.getsignal(signal.SIGTERM)
    counter = itertools.count()
    models: list[nn.Module] = []

    def work() -> None:
        trainer, loader = build(tmp_path / f"try{next(counter)}")
        models.append(trainer.model)
        trainer.fit(loader)

    def after(_hit: bool) -> None:
        assert torch.is_grad_enabled()
        assert signal.getsignal(signal.SIGTERM) == sigterm
        assert all(bool(torch.isfinite(p).all()) for p in models[-1].parameters())

    hits, runs = interrupt_repeatedly(work, after, trials=TRIALS, seed=1, hits=TRIALS // 3)
    assert hits >= TRIALS // 3, f"only {hits} of {runs} runs were interrupted"
    stray = [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
    assert not stray, f"half-written files left: {stray}"
    for path in tmp_path.rglob("ckpt_*.pt"):
        ckpt.read_checkpoint(path)
