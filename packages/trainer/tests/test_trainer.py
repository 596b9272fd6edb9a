"""The training loops in one process under perceptrain's meanings: epochs, stages, hooks,
callbacks, accumulation, resume, run folders, the LM loop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.testing.models import flat
from marquardt.trainer import (
    Callback,
    ConfigError,
    EarlyStopping,
    LaunchError,
    OptimizeResult,
    TrainConfig,
    Trainer,
    TrainingStage,
    _compute,
)
from marquardt.trainer._persistence import _files as ckpt
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


def _config(tmp_path: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "max_iter": 3,
        "log_folder": tmp_path,
        "verbose": False,
        "seed": 0,
        "write_every": 1,
    }
    base.update(kw)
    return TrainConfig(**base)


def test_fit_trains_max_iter_plus_one_epochs_of_every_batch(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    start = _full_loss(model)
    trainer = Trainer(model, optimizer, _config(tmp_path))
    out_model, out_opt = trainer.fit(_loader(shuffle=True))
    assert out_model is model and out_opt is optimizer
    assert (trainer.global_step, trainer.current_epoch) == (32, 3)  # epochs 0-3 of 8 batches
    assert _full_loss(model) < 0.5 * start
    rows = list(read_csv(tmp_path / "metrics.csv"))
    # epochs 1, 2, 3 (callbacks skip epoch 0), then the last epoch again at the end
    assert [(int(r["epoch"]), int(r["step"])) for r in rows] == [(1, 16), (2, 24), (3, 32)] * 1 + [
        (3, 32)
    ]
    assert (tmp_path / "hparams.json").exists()
    assert isinstance(trainer.opt_result, OptimizeResult) and trainer.opt_result.iteration == 3
    assert set(trainer.opt_result.metrics) == {"train_loss"}


def test_the_seed_s_config_takes_perceptrain_s_number_of_steps(tmp_path: Path) -> None:
    model = _model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _config(tmp_path, max_iter=50, write_every=0),
    )
    trainer.fit(_loader(batch_size=10))  # 64 samples in 7 batches
    assert trainer.global_step == 357 and trainer.current_epoch == 50


def test_a_second_fit_trains_its_epochs_again_from_the_model_as_it_is(tmp_path: Path) -> None:
    starts: list[float] = []

    class Recording(Trainer):
        def on_train_start(self) -> None:
            starts.append(_full_loss(self.model))

    model = _model()
    trainer = Recording(model, torch.optim.SGD(model.parameters(), lr=0.2), _config(tmp_path))
    trainer.fit(_loader())
    first_run = trainer.config.log_folder
    after_first = _full_loss(model)
    trainer.fit(_loader(batch_size=16))  # 4 batches an epoch
    assert (trainer.global_step, trainer.current_epoch) == (16, 3)  # epochs 0-3 again
    assert starts[1] == after_first  # went on from the trained weights
    assert trainer.config.log_folder != first_run  # a run folder of its own
    assert len(list(read_csv(Path(first_run) / "metrics.csv"))) == 4  # the first run kept whole


def test_lbfgs_works_through_the_closure(tmp_path: Path) -> None:
    model = _model()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    start = _full_loss(model)
    Trainer(model, optimizer, _config(tmp_path, max_iter=10)).fit(_loader(batch_size=64))
    assert _full_loss(model) < 0.2 * start


def test_gradient_accumulation_equals_the_larger_batch(tmp_path: Path) -> None:
    a, b = _model(), _model()
    Trainer(a, torch.optim.SGD(a.parameters(), lr=0.1), _config(tmp_path / "a", max_iter=3)).fit(
        _loader(batch_size=16)
    )
    trainer = Trainer(
        b,
        torch.optim.SGD(b.parameters(), lr=0.1),
        _config(tmp_path / "b", max_iter=3, accumulate_grad_batches=2),
    )
    trainer.fit(_loader(batch_size=8))
    assert trainer.global_step == 16
    assert torch.allclose(flat(a), flat(b), atol=1e-6)


def test_grad_clip_bounds_the_step(tmp_path: Path) -> None:
    model = _model()
    before = flat(model)
    Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        _config(tmp_path, max_iter=0, grad_clip=1e-3),
    ).fit(_loader(batch_size=64))
    assert float((flat(model) - before).norm()) <= 1e-3 + 1e-7


class Recording(Trainer):
    """A subclass overriding perceptrain's hook methods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []

    def on_train_start(self) -> None:
        self.events.append("on_train_start")

    def on_train_end(self, train_losses: Any, val_losses: Any = None) -> None:
        self.events.append(f"on_train_end{len(train_losses)},{len(val_losses)}")

    def on_train_epoch_start(self) -> None:
        self.events.append(f"on_epoch_start{self.current_epoch}")

    def on_train_epoch_end(self, results: Any) -> None:
        self.events.append(f"on_epoch_end{self.current_epoch}:{len(results)}")

    def on_train_batch_end(self, loss_metrics: Any) -> None:
        self.events.append(f"on_batch_end{self.global_step}")

    def on_val_epoch_end(self, results: Any) -> None:
        self.events.append(f"on_val_end{self.current_epoch}")

    def on_val_batch_start(self, batch: Any) -> None:
        self.events.append("on_val_batch")


def _record(events: list[str], name: str) -> Callback:
    def record(trainer: Any, config: Any, writer: Any) -> None:
        events.append(f"{name}{trainer.opt_result.iteration}")

    return Callback(on=name, called_every=1, callback=record)


def test_hooks_and_callbacks_run_at_perceptrain_s_stages_in_order(tmp_path: Path) -> None:
    model = _model()
    events: list[str] = []
    callbacks = [
        _record(events, s) for s in ("train_start", "train_epoch_end", "val_epoch_end", "train_end")
    ]
    config = _config(tmp_path, max_iter=2, val_every=2, write_every=0, callbacks=callbacks)
    trainer = Recording(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
    trainer.events = events
    trainer.fit(_loader(batch_size=32), _loader(batch_size=64))
    assert events == [
        "on_val_batch",  # the validation before training: callbacks skip epoch 0
        "train_start0",
        "on_train_start",
        "on_epoch_start0", "on_batch_end1", "on_batch_end2", "on_epoch_end0:2",
        "on_val_batch", "on_val_end0",
        "on_epoch_start1", "on_batch_end3", "on_batch_end4", "train_epoch_end1",
        "on_epoch_end1:2",
        "on_epoch_start2", "on_batch_end5", "on_batch_end6", "train_epoch_end2",
        "on_epoch_end2:2",
        "on_val_batch", "val_epoch_end2", "on_val_end2",
        "on_train_end3,2",
        "train_end2",
    ]  # fmt: skip
    assert trainer.training_stage is TrainingStage.IDLE


def test_called_every_condition_and_modify_optimize_result(tmp_path: Path) -> None:
    seen: list[tuple[int, Any]] = []

    def remember(trainer: Any, config: Any, writer: Any) -> int:
        seen.append((trainer.opt_result.iteration, trainer.opt_result.extra.get("tag")))
        return 1

    callback = Callback(
        on="train_epoch_end",
        called_every=2,
        callback=remember,
        callback_condition=lambda opt: opt.iteration != 4,
        modify_optimize_result={"tag": "x"},
    )
    model = _model()
    config = _config(tmp_path, max_iter=6, write_every=0, callbacks=[callback])
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config).fit(_loader(batch_size=64))
    assert seen == [(2, "x"), (6, "x")]


class Subclassed(Callback):
    def __init__(self) -> None:
        super().__init__(on="train_batch_end", called_every=3)
        self.calls = 0

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        self.calls += 1
        assert writer is not None and trainer.accelerator.rank == 0


def test_a_run_callback_subclass_runs_every_called_every_epochs(tmp_path: Path) -> None:
    callback = Subclassed()
    model = _model()
    config = _config(tmp_path, max_iter=6, callbacks=[callback])
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config).fit(_loader(batch_size=32))
    assert callback.calls == 4  # two batches in each of epochs 3 and 6


def test_a_bad_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="Invalid value for 'on'"):
        Callback(on="after_epoch")
    with pytest.raises(ValueError, match="called_every must be a whole number"):
        Callback(on="train_end", called_every=1.5)  # type: ignore[arg-type]


def _batch_loss(batch: Any, model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x, y = batch
    error = model(x) - y
    return (error**2).mean(), {"mae": error.abs().mean()}


def test_perceptrain_loss_with_metrics_and_a_criterion_both_work(tmp_path: Path) -> None:
    a, b = _model(), _model()
    first = Trainer(
        a, torch.optim.SGD(a.parameters(), lr=0.1), _config(tmp_path / "a"), loss_fn=_batch_loss
    )
    first.fit(_loader())
    Trainer(
        b,
        torch.optim.SGD(b.parameters(), lr=0.1),
        _config(tmp_path / "b"),
        loss_fn=lambda out, target: ((out - target) ** 2).mean(),
    ).fit(_loader())
    assert torch.allclose(flat(a), flat(b), atol=1e-6)
    assert set(first.opt_result.metrics) == {"train_mae", "train_loss"}  # type: ignore[union-attr]
    assert "train_mae" in read_csv(tmp_path / "a" / "metrics.csv")[0]


class SelfLoss(nn.Module):
    """A model that computes its own loss (no data), as qadence's VQE examples do."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor([2.0]))

    def forward(self) -> torch.Tensor:
        return ((self.theta - 0.5) ** 2).sum()


def test_fit_without_data_evaluates_the_model_s_own_loss(tmp_path: Path) -> None:
    model = SelfLoss()
    seen: list[Any] = []

    def loss_fn(batch: Any, model: nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
        seen.append(batch)
        return model(), {}

    trainer = Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), _config(tmp_path, max_iter=49), loss_fn
    )
    trainer.fit()
    assert trainer.global_step == 50 and len(seen) == 50 and set(seen) == {None}
    assert abs(float(model.theta) - 0.5) < 1e-3


def test_test_runs_its_batches_with_their_hooks(tmp_path: Path) -> None:
    model = _model()
    trainer = Recording(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path),
        loss_fn=_batch_loss,
        train_dataloader=_loader(),
        test_dataloader=_loader(batch_size=32),
    )
    results = trainer.test()
    assert len(results) == 2 and set(results[0][1]) == {"test_mae", "test_loss"}
    assert torch.isclose(results[0][0], results[0][1]["test_loss"])


def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path) -> None:
    straight = _model()
    Trainer(
        straight,
        torch.optim.Adam(straight.parameters(), lr=0.01),
        _config(tmp_path / "a", max_iter=4),
    ).fit(_loader(shuffle=True))
    first = _model()
    Trainer(
        first,
        torch.optim.Adam(first.parameters(), lr=0.01),
        _config(tmp_path / "b", max_iter=2, checkpoint_every=1),
    ).fit(_loader(shuffle=True))
    second = _model(seed=5)  # different initial weights: everything must come from the file
    trainer = Trainer(
        second,
        torch.optim.Adam(second.parameters(), lr=0.01),
        _config(tmp_path / "b", max_iter=4, resume_from="latest"),
    )
    trainer.fit(_loader(shuffle=True))
    assert (trainer.global_step, trainer.current_epoch) == (40, 4)
    assert trainer.config.log_folder == tmp_path / "b"  # resumed in the run's folder
    assert abs(_full_loss(second) - _full_loss(straight)) < 1e-6
    assert torch.allclose(flat(second), flat(straight), atol=1e-6)
    epochs = [int(r["epoch"]) for r in read_csv(tmp_path / "b" / "metrics.csv")]
    # the CSV continues after the rows of the first fit (which ended with epoch 2 again)
    assert epochs == [1, 2, 2, 3, 4, 4]


def _checkpoint_steps(run: Path) -> list[int]:
    return [s for s, _ in ckpt.list_checkpoints(run / ckpt.CHECKPOINT_DIR)]


def test_two_runs_into_one_folder_keep_both_whole_and_resume_the_named_run(
    tmp_path: Path,
) -> None:
    def run(max_iter: int, **kw: Any) -> Trainer:
        model = _model()
        config = TrainConfig(
            root_folder=tmp_path,
            max_iter=max_iter,
            write_every=1,
            checkpoint_every=1,
            keep_checkpoints=10,
            verbose=False,
            **kw,
        )
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
        trainer.fit(_loader(batch_size=32))
        return trainer

    first = Path(run(4).config.log_folder)
    second = Path(run(2).config.log_folder)
    assert first != second and first.parent == second.parent == tmp_path
    assert first.name.startswith("1_") and second.name.startswith("2_")
    assert len(read_csv(first / "metrics.csv")) == 5 and _checkpoint_steps(first) == [4, 6, 8, 10]
    assert len(read_csv(second / "metrics.csv")) == 3 and _checkpoint_steps(second) == [4, 6]
    # "latest" resumes the newest run, in its own folder; the first run stays whole.
    resumed = run(3, resume_from="latest")
    assert Path(resumed.config.log_folder) == second and resumed.global_step == 8
    assert _checkpoint_steps(second) == [4, 6, 8] and len(read_csv(second / "metrics.csv")) == 5
    assert len(read_csv(first / "metrics.csv")) == 5 and _checkpoint_steps(first) == [4, 6, 8, 10]
    # A checkpoint path resumes the run it belongs to.
    named = run(5, resume_from=first / "checkpoints" / ckpt.checkpoint_name(10))
    assert Path(named.config.log_folder) == first and named.global_step == 12
    assert _checkpoint_steps(first) == [4, 6, 8, 10, 12]
    assert [int(r["epoch"]) for r in read_csv(first / "metrics.csv")] == [1, 2, 3, 4, 4, 5, 5]
    assert _checkpoint_steps(second) == [4, 6, 8]


def test_requeued_slurm_job_resumes_without_being_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model()
    Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path, max_iter=2, checkpoint_every=1),
    ).fit(_loader())
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    trainer = Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), _config(tmp_path, max_iter=3)
    )
    trainer.fit(_loader())
    rows = list(read_csv(tmp_path / "metrics.csv"))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 2, 3, 3]
    assert trainer.global_step == 32


def test_sigterm_in_process_checkpoints_and_exits_zero(tmp_path: Path) -> None:
    import os
    import signal

    def term(trainer: Any, config: Any, writer: Any) -> None:
        if trainer.global_step == 11:
            os.kill(os.getpid(), signal.SIGTERM)

    model = _model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path, max_iter=50, callbacks=[Callback("train_batch_end", 1, term)]),
    )
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit(_loader())
    assert exit_info.value.code == 0
    assert trainer.state.interrupted and trainer.global_step == 11
    assert (tmp_path / "checkpoints" / "ckpt_000000011.pt").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler removed afterwards


def test_a_callback_stops_training_through_the_trainer_flag(tmp_path: Path) -> None:
    def stop(trainer: Any, config: Any, writer: Any) -> None:
        trainer._stop_training.fill_(1)

    model = _model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path, max_iter=50, callbacks=[Callback("train_epoch_end", 3, stop)]),
    )
    trainer.fit(_loader())
    assert trainer.current_epoch == 3 and trainer.stop_training()


def test_print_every_prints_the_epoch_mean_in_perceptrain_s_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        _config(tmp_path, max_iter=6, print_every=3, verbose=True),
        loss_fn=_batch_loss,
    )
    losses: list[float] = []

    def remember(t: Any, c: Any, w: Any) -> None:
        losses.append(float(t.opt_result.metrics["train_loss"]))

    trainer.config.callbacks.append(Callback("train_epoch_end", 3, remember))
    trainer.fit(_loader())
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("P ")]
    assert lines == [
        f"P  0|cpu    | Iteration {epoch: >7}| Train_Loss: {loss:.7f} -train_mae: "
        + lines[i].split("train_mae: ")[1]
        for i, (epoch, loss) in enumerate(zip((3, 6), losses, strict=True))
    ]


def test_validation_keeps_the_best_checkpoint_and_early_stopping_stops(tmp_path: Path) -> None:
    model = _model()
    stopper = EarlyStopping(patience=2)
    # lr = 0: the validation loss never improves after the first validation.
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        _config(
            tmp_path,
            max_iter=100,
            val_every=3,
            checkpoint_best_only=True,
            validation_criterion=lambda val, best, eps: val < best - eps,
            callbacks=[stopper],
        ),
    )
    trainer.fit(_loader(), val_dataloader=_loader(batch_size=64))
    assert trainer.current_epoch == 9 and stopper.stopped_at == 9
    assert "early stopping" in trainer.state.stop_reason
    assert (tmp_path / "checkpoints" / "best.pt").exists()
    assert _checkpoint_steps(tmp_path) == []  # best only
    rows = [r for r in read_csv(tmp_path / "metrics.csv") if r["phase"] == "val"]
    assert [int(r["epoch"]) for r in rows] == [0, 3, 6, 9]


def test_validation_needs_validation_data(tmp_path: Path) -> None:
    model = _model()
    trainer = Trainer(model, torch.optim.SGD(model.parameters()), _config(tmp_path, val_every=1))
    with pytest.raises(ConfigError, match=r"val_every=1\) but there is no validation data"):
        trainer.fit(_loader())


# --------------------------------------------------------------------- bad input
def test_set_use_grad_false_means_gradient_free(tmp_path: Path) -> None:
    Trainer.set_use_grad(False)
    model = _model()
    with pytest.raises(ConfigError, match=r"trains gradient-free with a nevergrad optimizer.*HINT"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _config(tmp_path))
    Trainer.set_use_grad(True)
    trainer = Trainer(model, None, _config(tmp_path, max_iter=0))
    with pytest.raises(ConfigError, match="no optimizer"):
        trainer.fit(_loader())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainer.enable_grad_opt(sgd):
        assert trainer.optimizer is sgd and trainer.use_grad
        trainer.fit(_loader())
    assert trainer.optimizer is None and trainer.global_step == 8
    with (
        pytest.raises(ConfigError, match="gradient-free"),
        trainer.disable_grad_opt(sgd),
    ):
        pass
    assert trainer.use_grad


def test_optimize_step_passed_in_the_old_position_is_explained(tmp_path: Path) -> None:
    model = _model()
    with pytest.raises(ConfigError, match="pass optimize_step by keyword"):
        Trainer(model, torch.optim.SGD(model.parameters()), _config(tmp_path), "mse", optimize_step)


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
    before = flat(model)
    empty = DataLoader(TensorDataset(torch.zeros(0, 1), torch.zeros(0, 1)), batch_size=4)
    with pytest.raises(ConfigError, match="yields no batches"):
        Trainer(model, torch.optim.SGD(model.parameters()), _config(tmp_path)).fit(empty)
    assert torch.equal(flat(model), before)


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
        model,
        torch.optim.SGD(model.parameters()),
        _config(tmp_path, compute_setup="auto", backend="nccl", max_iter=0),
    )
    trainer.fit(_loader())
    assert "replaced by 'gloo'" in capsys.readouterr().err


def test_batch_that_is_not_a_pair_is_explained(tmp_path: Path) -> None:
    model = _model()
    loader = DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=4)
    with pytest.raises(TypeError, match=r"expected a batch \(inputs, targets\).*HINT"):
        Trainer(model, torch.optim.SGD(model.parameters()), _config(tmp_path)).fit(loader)


def test_custom_optimize_step_without_grad_clip_is_refused(tmp_path: Path) -> None:
    def my_step(model: Any, optimizer: Any, loss_fn: Any, xs: Any, device: Any, dtype: Any) -> Any:
        return optimize_step(model, optimizer, loss_fn, xs, device, dtype)

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
        _config(tmp_path, max_iter=1),
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
    trainer = Trainer(model, lma, _config(tmp_path, max_iter=19, checkpoint_every=19))
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
    trainer = Trainer(model, lma, _config(tmp_path, max_iter=50))
    trainer.fit(loader)
    assert trainer.global_step < 102 and trainer.state.should_stop
    assert trainer.state.stop_reason.startswith("LM terminated")


def test_lm_loop_refuses_several_processes(tmp_path: Path) -> None:
    model, lma, _ = _lm_setup()
    with pytest.raises(
        ConfigError, match=r"nprocs=2\) with an LMA built beforehand.*HINT: pass a factory"
    ):
        Trainer(model, lma, _config(tmp_path, nprocs=2))


def test_the_lma_chooses_the_lm_loop_and_set_use_grad_false_warns(tmp_path: Path) -> None:
    Trainer.set_use_grad(False)
    model, lma, loader = _lm_setup()
    with pytest.warns(UserWarning, match="the LM loop is chosen by passing an LMA"):
        trainer = Trainer(model, lma, _config(tmp_path, max_iter=0))
    trainer.fit(loader)
    assert trainer.is_lm and trainer.global_step == 2


def test_lm_checkpoint_does_not_resume_a_gradient_run(tmp_path: Path) -> None:
    model, lma, loader = _lm_setup()
    Trainer(model, lma, _config(tmp_path, max_iter=0, checkpoint_every=1)).fit(loader)
    before = flat(model)
    with pytest.raises(Exception, match="written by the 'lm' loop but this run uses the 'ddp'"):
        Trainer(
            model,
            torch.optim.SGD(model.parameters()),
            _config(tmp_path / "x", resume_from=tmp_path / "checkpoints" / "ckpt_000000002.pt"),
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
    trainer = Trainer(model, lma, _config(tmp_path, max_iter=0, slice_size=100))
    trainer.fit(loader)
    assert lma.state_dict()["steps"] == 3
