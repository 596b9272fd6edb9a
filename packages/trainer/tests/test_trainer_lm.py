"""The Trainer's LM loop: an LMA as the optimizer, its stopping, its checkpoints, its
slices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.testing.models import flat
from marquardt.trainer import ConfigError, Trainer

from .conftest import read_csv
from .training import make_config

pytestmark = pytest.mark.usefixtures("restore_use_grad")


# --------------------------------------------------------------------- the LM loop
def _lm_setup(**lma_kwargs: Any) -> tuple[nn.Module, Any, DataLoader]:  # type: ignore[type-arg]
    from marquardt.solver import LMA

    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 400).unsqueeze(1)
    loader = DataLoader(TensorDataset(x, torch.sinc(10 * x)), batch_size=200, shuffle=True)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, LMA(model, [torch.device("cpu")], lambda a, b: a - b, **lma_kwargs), loader


def test_lm_loop_fits_sinc_and_logs_damping(tmp_path: Path) -> None:
    model, lma, loader = _lm_setup()
    trainer = Trainer(model, lma, make_config(tmp_path, max_iter=19, checkpoint_every=19))
    out_model, out_lma = trainer.fit(loader)  # 20 epochs of 2 batches
    assert out_model is model and out_lma is lma
    x = torch.linspace(-1, 1, 400).unsqueeze(1)
    with torch.no_grad():
        loss = float(nn.functional.mse_loss(model(x), torch.sinc(10 * x)))
    assert loss < 5e-3
    rows = list(read_csv(tmp_path / "metrics.csv"))
    assert len(rows) == 20 and {"train_damping", "train_attempts", "train_accepted"} <= set(rows[0])
    data = torch.load(tmp_path / "checkpoints" / "ckpt_000000040.pt", weights_only=True)
    assert data["kind"] == "lm" and data["optimizer"] is None and data["lma"]["steps"] == 40


def test_lm_loop_stops_when_lm_terminates(tmp_path: Path) -> None:
    model, lma, loader = _lm_setup(ftol=0.5)
    trainer = Trainer(model, lma, make_config(tmp_path, max_iter=50))
    trainer.fit(loader)
    assert trainer.global_step < 102 and trainer.state.should_stop
    assert trainer.state.stop_reason.startswith("LM terminated")


def test_lm_loop_refuses_several_processes(tmp_path: Path) -> None:
    model, lma, _ = _lm_setup()
    with pytest.raises(
        ConfigError, match=r"nprocs=2\) with an LMA built beforehand.*HINT: pass a factory"
    ):
        Trainer(model, lma, make_config(tmp_path, nprocs=2))


def test_the_lma_chooses_the_lm_loop_and_set_use_grad_false_warns(tmp_path: Path) -> None:
    Trainer.set_use_grad(False)
    model, lma, loader = _lm_setup()
    with pytest.warns(UserWarning, match="the LM loop is chosen by passing an LMA"):
        trainer = Trainer(model, lma, make_config(tmp_path, max_iter=0))
    trainer.fit(loader)
    assert trainer.is_lm and trainer.global_step == 2


def test_lm_checkpoint_does_not_resume_a_gradient_run(tmp_path: Path) -> None:
    model, lma, loader = _lm_setup()
    Trainer(model, lma, make_config(tmp_path, max_iter=0, checkpoint_every=1)).fit(loader)
    before = flat(model)
    with pytest.raises(Exception, match="written by the 'lm' loop but this run uses the 'ddp'"):
        Trainer(
            model,
            torch.optim.SGD(model.parameters()),
            make_config(tmp_path / "x", resume_from=tmp_path / "checkpoints" / "ckpt_000000002.pt"),
        ).fit(loader)
    assert torch.equal(flat(model), before)


def test_lm_slice_size_shrinks_to_a_short_last_batch(tmp_path: Path) -> None:
    from marquardt.solver import LMA

    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 250).unsqueeze(1)
    # 250 samples in batches of 100: the third batch has 50 rows, fewer than slice_size
    loader = DataLoader(TensorDataset(x, torch.sinc(10 * x)), batch_size=100)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    lma = LMA(model, [torch.device("cpu")], lambda a, b: a - b)
    trainer = Trainer(model, lma, make_config(tmp_path, max_iter=0, slice_size=100))
    trainer.fit(loader)
    assert lma.state_dict()["steps"] == 3


def test_a_torch_optimizer_run_does_not_import_the_solver() -> None:
    """Asking whether the optimizer is an LMA imports nothing (SciPy comes with the solver:
    about 0.3 s of every run with a torch optimizer); an LMA is still told apart."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from marquardt.trainer import TrainConfig, Trainer\n"
        "from marquardt.trainer._loops._lm import is_lma\n"
        "m = torch.nn.Linear(1, 1)\n"
        "Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), TrainConfig(verbose=False))\n"
        "assert 'marquardt.solver' not in sys.modules, 'the solver was imported'\n"
        "from marquardt.solver import LMA\n"
        "assert is_lma(LMA(m, ['cpu'], residual_fn=torch.sub))\n"
        "assert not is_lma(torch.optim.SGD(m.parameters(), lr=0.1))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
