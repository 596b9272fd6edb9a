"""The training loops in one process: fit, callbacks, accumulation, resume, the LM loop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import (
    Callback,
    ConfigError,
    EarlyStopping,
    LaunchError,
    TrainConfig,
    Trainer,
    _compute,
)
from marquardt.trainer.optimize_step import optimize_step

from .conftest import read_csv


@pytest.fixture(autouse=True)
def _restore_use_grad() -> Iterator[None]:
    yield
    Trainer.set_use_grad(True)


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(-1, 1, n).unsqueeze(1)
    return x, torch.sinc(3 * x)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))


def _loader(batch_size: int = 8, shuffle: bool = False, n: int = 64) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(TensorDataset(*_data(n)), batch_size=batch_size, shuffle=shuffle)


def _full_loss(model: nn.Module) -> float:
    x, y = _data()
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _config(tmp_path: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "max_iter": 30,
        "root_folder": tmp_path,
        "verbose": False,
        "seed": 0,
        "write_every": 1,
    }
    base.update(kw)
    return TrainConfig(**base)


def test_fit_trains_and_returns_the_model_and_optimizer(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    start = _full_loss(model)
    out_model, out_opt = Trainer(model, optimizer, _config(tmp_path)).fit(_loader(shuffle=True))
    assert out_model is model and out_opt is optimizer
    assert _full_loss(model) < 0.5 * start
    rows = list(read_csv(tmp_path / "metrics.csv"))
    assert [int(r["step"]) for r in rows] == list(range(1, 31))
    assert (tmp_path / "hparams.json").exists()


def test_lbfgs_works_through_the_closure(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    start = _full_loss(model)
    Trainer(model, optimizer, _config(tmp_path, max_iter=10)).fit(_loader(batch_size=64))
    assert _full_loss(model) < 0.2 * start


def test_gradient_accumulation_equals_the_larger_batch(tmp_path: Path) -> None:
    a, b = _model(), _model()
    Trainer(a, torch.optim.SGD(a.parameters(), lr=0.1), _config(tmp_path / "a", max_iter=12)).fit(
        _loader(batch_size=16)
    )
    Trainer(
        b,
        torch.optim.SGD(b.parameters(), lr=0.1),
        _config(tmp_path / "b", max_iter=12, accumulate_grad_batches=2),
    ).fit(_loader(batch_size=8))
    assert torch.allclose(_flat(a), _flat(b), atol=1e-6)


def test_grad_clip_bounds_the_step(tmp_path: Path) -> None:
    model = _model()
    before = _flat(model)
    Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        _config(tmp_path, max_iter=1, grad_clip=1e-3),
    ).fit(_loader())
    assert float((_flat(model) - before).norm()) <= 1e-3 + 1e-7


class Recorder(Callback):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_train_start(self, trainer: Trainer) -> None:
        self.events.append("train_start")

    def on_train_end(self, trainer: Trainer) -> None:
        self.events.append("train_end")

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        self.events.append(f"epoch_start{epoch}")

    def on_epoch_end(self, trainer: Trainer, epoch: int) -> None:
        self.events.append(f"epoch_end{epoch}")

    def on_batch_end(self, trainer: Trainer, loss: float, metrics: dict[str, float]) -> None:
        self.events.append(f"batch{trainer.state.step}")

    def on_validation_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        self.events.append(f"val{trainer.state.step}")


def test_callback_hooks_run_in_order(tmp_path: Path) -> None:
    recorder = Recorder()
    model = _model()
    config = _config(tmp_path, max_iter=5, val_every=2, callbacks=[recorder])
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config).fit(
        _loader(batch_size=32), val_loader=_loader(batch_size=32)
    )
    assert recorder.events == [
        "train_start",
        "epoch_start0",
        "batch1",
        "batch2",
        "val2",
        "epoch_end0",
        "epoch_start1",
        "batch3",
        "batch4",
        "val4",
        "epoch_end1",
        "epoch_start2",
        "batch5",
        "val5",
        "train_end",
    ]


def test_validation_tracks_the_best_checkpoint_and_early_stopping_stops(tmp_path: Path) -> None:
    model = _model()
    stopper = EarlyStopping(patience=2)
    # lr = 0: the validation loss never improves after the first validation.
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        _config(tmp_path, max_iter=100, val_every=3, callbacks=[stopper]),
    )
    trainer.fit(_loader(), val_loader=_loader(batch_size=64))
    assert trainer.state.step == 9 and stopper.stopped_at == 9
    assert "early stopping" in trainer.state.stop_reason
    assert (tmp_path / "checkpoints" / "best.pt").exists()
    rows = [r for r in read_csv(tmp_path / "metrics.csv") if r["phase"] == "val"]
    assert [int(r["step"]) for r in rows] == [3, 6, 9]


def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path) -> None:
    straight = _model()
    Trainer(
        straight,
        torch.optim.Adam(straight.parameters(), lr=0.01),
        _config(tmp_path / "a", max_iter=20),
    ).fit(_loader(shuffle=True))
    first = _model()
    Trainer(
        first, torch.optim.Adam(first.parameters(), lr=0.01), _config(tmp_path / "b", max_iter=11)
    ).fit(_loader(shuffle=True))
    second = _model(seed=5)  # different initial weights: everything must come from the file
    trainer = Trainer(
        second,
        torch.optim.Adam(second.parameters(), lr=0.01),
        _config(tmp_path / "b", max_iter=20, resume_from="latest"),
    )
    trainer.fit(_loader(shuffle=True))
    assert trainer.state.step == 20
    assert abs(_full_loss(second) - _full_loss(straight)) < 1e-6
    assert torch.allclose(_flat(second), _flat(straight), atol=1e-6)
    steps = [int(r["step"]) for r in read_csv(tmp_path / "b" / "metrics.csv")]
    assert steps == list(range(1, 21))  # the CSV continues without duplicates


def test_subfolder_per_run_and_latest_across_runs(tmp_path: Path) -> None:
    model = _model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path, max_iter=3, create_subfolder_per_run=True),
    )
    trainer.fit(_loader())
    run = trainer.state.log_folder
    assert run is not None and run.parent == tmp_path and run.name.startswith("run_")
    again = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path, max_iter=5, create_subfolder_per_run=True, resume_from="latest"),
    )
    again.fit(_loader())
    assert again.state.log_folder == run and again.state.step == 5


def test_requeued_slurm_job_resumes_without_being_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model()
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _config(tmp_path, max_iter=4)).fit(
        _loader()
    )
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    trainer = Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), _config(tmp_path, max_iter=6)
    )
    trainer.fit(_loader())
    rows = list(read_csv(tmp_path / "metrics.csv"))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]


def test_sigterm_in_process_checkpoints_and_exits_zero(tmp_path: Path) -> None:
    import os
    import signal

    class Term(Callback):
        def on_batch_end(self, trainer: Trainer, loss: float, metrics: dict[str, float]) -> None:
            if trainer.state.step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    model = _model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path, max_iter=50, callbacks=[Term()]),
    )
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit(_loader())
    assert exit_info.value.code == 0
    assert trainer.state.interrupted and trainer.state.step == 3
    assert (tmp_path / "checkpoints" / "ckpt_000000003.pt").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler removed afterwards


def test_print_every_prints_on_rank_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model()
    Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path, max_iter=6, print_every=3, verbose=True),
    ).fit(_loader())
    out = capsys.readouterr().out
    assert "train step 3/6" in out and "train step 6/6" in out and "step 4/6" not in out


# --------------------------------------------------------------------- bad input
def test_set_use_grad_false_needs_an_lma(tmp_path: Path) -> None:
    Trainer.set_use_grad(False)
    model = _model()
    with pytest.raises(ConfigError, match=r"selects the LM loop, which needs an LMA.*HINT"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _config(tmp_path))


def test_optimizer_of_another_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="parameter\\(s\\) that are not the model's"):
        Trainer(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), _config(tmp_path))


def test_model_without_trainable_parameters_is_refused(tmp_path: Path) -> None:
    model = _model().requires_grad_(False)
    with pytest.raises(ConfigError, match="has no trainable parameters"):
        Trainer(model, torch.optim.SGD(_model().parameters(), lr=0.1), _config(tmp_path))


def test_unknown_loss_and_lbfgs_accumulation_are_refused(tmp_path: Path) -> None:
    model = _model()
    with pytest.raises(ConfigError, match="unknown loss name"):
        Trainer(model, torch.optim.SGD(model.parameters()), _config(tmp_path), loss_fn="l1")
    with pytest.raises(ConfigError, match="accumulate_grad_batches > 1 with LBFGS"):
        Trainer(
            model,
            torch.optim.LBFGS(model.parameters()),
            _config(tmp_path, accumulate_grad_batches=2),
        )


def test_empty_loader_is_refused_before_work(tmp_path: Path) -> None:
    model = _model()
    before = _flat(model)
    empty = DataLoader(TensorDataset(torch.zeros(0, 1), torch.zeros(0, 1)), batch_size=4)
    with pytest.raises(ConfigError, match="yields no batches"):
        Trainer(model, torch.optim.SGD(model.parameters()), _config(tmp_path)).fit(empty)
    assert torch.equal(_flat(model), before)


def test_gpu_setups_without_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_compute, "visible_gpu_count", lambda: 0)
    model = _model()
    with pytest.raises(LaunchError, match=r"compute_setup='gpu'\) but no GPU.*HINT"):
        Trainer(
            model,
            torch.optim.SGD(model.parameters()),
            _config(tmp_path, compute_setup="gpu", backend="nccl"),
        )
    trainer = Trainer(
        model, torch.optim.SGD(model.parameters()), _config(tmp_path, backend="nccl", max_iter=1)
    )
    trainer.fit(_loader())
    assert "replaced by 'gloo'" in capsys.readouterr().err


def test_batch_that_is_not_a_pair_is_explained(tmp_path: Path) -> None:
    model = _model()
    loader = DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=4)
    with pytest.raises(TypeError, match=r"expects a batch \(inputs, targets\).*HINT"):
        Trainer(model, torch.optim.SGD(model.parameters()), _config(tmp_path)).fit(loader)


def test_custom_optimize_step_without_grad_clip_is_refused(tmp_path: Path) -> None:
    def my_step(
        model: Any, optimizer: Any, loss_fn: Any, batch: Any, device: Any, dtype: Any
    ) -> Any:
        return optimize_step(model, optimizer, loss_fn, batch, device, dtype)

    model = _model()
    with pytest.raises(ConfigError, match="takes no grad_clip argument"):
        Trainer(
            model,
            torch.optim.SGD(model.parameters()),
            _config(tmp_path, grad_clip=1.0),
            optimize_step=my_step,
        )
    Trainer(
        model,
        torch.optim.SGD(model.parameters()),
        _config(tmp_path, max_iter=2),
        optimize_step=my_step,
    ).fit(_loader())


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
    trainer = Trainer(model, lma, _config(tmp_path, max_iter=40))
    out_model, out_lma = trainer.fit(loader)
    assert out_model is model and out_lma is lma
    x = torch.linspace(-1, 1, 400).unsqueeze(1)
    with torch.no_grad():
        loss = float(nn.functional.mse_loss(model(x), torch.sinc(10 * x)))
    assert loss < 5e-3
    rows = list(read_csv(tmp_path / "metrics.csv"))
    assert len(rows) == 40 and {"damping", "attempts", "accepted"} <= set(rows[0])
    data = torch.load(tmp_path / "checkpoints" / "ckpt_000000040.pt", weights_only=True)
    assert data["kind"] == "lm" and data["optimizer"] is None and data["lma"]["steps"] == 40


def test_lm_loop_stops_when_lm_terminates(tmp_path: Path) -> None:
    model, lma, loader = _lm_setup(ftol=0.5)
    trainer = Trainer(model, lma, _config(tmp_path, max_iter=50))
    trainer.fit(loader)
    assert trainer.state.step < 50 and trainer.state.should_stop
    assert trainer.state.stop_reason.startswith("LM terminated")


def test_lm_loop_refuses_several_processes(tmp_path: Path) -> None:
    model, lma, _ = _lm_setup()
    with pytest.raises(
        ConfigError, match=r"nprocs=2\) with an LMA built beforehand.*HINT: pass a factory"
    ):
        Trainer(model, lma, _config(tmp_path, nprocs=2))


def test_lm_loop_with_set_use_grad_false(tmp_path: Path) -> None:
    Trainer.set_use_grad(False)
    model, lma, loader = _lm_setup()
    trainer = Trainer(model, lma, _config(tmp_path, max_iter=2))
    trainer.fit(loader)
    assert trainer.is_lm and trainer.state.step == 2


def test_lm_checkpoint_does_not_resume_a_gradient_run(tmp_path: Path) -> None:
    model, lma, loader = _lm_setup()
    Trainer(model, lma, _config(tmp_path, max_iter=2)).fit(loader)
    before = _flat(model)
    with pytest.raises(Exception, match="written by the 'lm' loop but this run uses the 'ddp'"):
        Trainer(
            model,
            torch.optim.SGD(model.parameters()),
            _config(tmp_path / "x", resume_from=tmp_path / "checkpoints" / "ckpt_000000002.pt"),
        ).fit(loader)
    assert torch.equal(_flat(model), before)


def test_lm_slice_size_shrinks_to_a_short_last_batch(tmp_path: Path) -> None:
    from marquardt.solver import LMA

    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 250).unsqueeze(1)
    # 250 samples in batches of 100: the third batch has 50 rows, fewer than slice_size
    loader = DataLoader(TensorDataset(x, torch.sinc(10 * x)), batch_size=100)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    lma = LMA(model, [torch.device("cpu")], lambda a, b: a - b)
    trainer = Trainer(model, lma, _config(tmp_path, max_iter=3, slice_size=100))
    trainer.fit(loader)
    assert lma.state_dict()["steps"] == 3
