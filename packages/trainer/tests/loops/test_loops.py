"""Each loop on its own (no Trainer, no runner): a step's result, its state, validation batches;
and the runner's schedule: LR schedulers, ``checkpoint_best_only``, ``WallClockBudget``."""

from __future__ import annotations

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
    TrainConfig,
    Trainer,
    WallClockBudget,
)
from marquardt.trainer._loops._base import StepResult
from marquardt.trainer._loops._gradient import GradientLoop
from marquardt.trainer._loops._lm import LMLoop
from marquardt.trainer._loss import resolve_loss
from marquardt.trainer._persistence import _files as ckpt
from marquardt.trainer.optimize_step import optimize_step

from ..conftest import read_csv
from ..training import make_model, sinc_data


def _batches(n: int = 32, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = sinc_data(n)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)]


def _gradient_loop(
    model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig | None = None
) -> GradientLoop:
    """A gradient loop of ``model`` with the mean squared error and the default step."""
    return GradientLoop(
        model, optimizer, resolve_loss("mse"), optimize_step, config or TrainConfig()
    )


def test_gradient_loop_takes_a_step_and_reports_it() -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loop = _gradient_loop(model, optimizer)
    assert loop.kind == "ddp" and loop.describe("gloo") == "DDP loop (gloo)"
    device = loop.pick_device(False, lambda: 0)
    loop.setup(device, world_size=1)
    before = [p.detach().clone() for p in model.parameters()]
    assert loop.batches_per_step == 1
    result = loop.step([loop.prepare_batch(_batches()[0], device)], device)
    assert isinstance(result, StepResult) and result.stop_reason is None
    x, y = _batches()[0]
    with torch.no_grad():
        start = float(nn.functional.mse_loss(make_model()(x), y))
    assert result.loss == pytest.approx(start)  # the loss at the parameters it started from
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    saved = loop.state_dict()
    assert saved["lma"] is None and saved["optimizer"]["param_groups"][0]["lr"] == 0.5


def test_gradient_loop_accumulates_and_restores_its_optimizer() -> None:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loop = _gradient_loop(model, optimizer, TrainConfig(accumulate_grad_batches=2))
    assert loop.batches_per_step == 2
    loop.step(_batches()[:2], torch.device("cpu"))
    fresh = make_model()
    other = _gradient_loop(fresh, torch.optim.Adam(fresh.parameters(), lr=0.01))
    other.load_state_dict(loop.state_dict())
    assert other.optimizer.state_dict()["state"][0]["step"] == 1


def test_gradient_loop_casts_batches_but_keeps_labels() -> None:
    model = make_model()
    loop = _gradient_loop(
        model, torch.optim.SGD(model.parameters(), lr=0.1), TrainConfig(dtype="float64")
    )
    batch = (torch.zeros(2, 1), torch.tensor([1, 2]))
    inputs, labels = loop.prepare_batch(batch, torch.device("cpu"))
    assert inputs.dtype == torch.float64 and labels.dtype == torch.int64


def test_lm_loop_takes_steps_asks_to_stop_and_restores_the_lma() -> None:
    from marquardt.solver import LMA

    model = make_model()
    lma = LMA(model, [torch.device("cpu")], lambda a, b: a - b)
    loop = LMLoop(model, lma, TrainConfig(slice_size=100))
    assert loop.kind == "lm" and loop.describe("gloo") == "LM loop"
    with pytest.raises(
        ConfigError,
        match=r"built beforehand runs in one process but torchrun starts 2.*HINT: pass a factory",
    ):
        loop.check_world("torchrun", 2)
    batch = _batches(64, 64)
    first = loop.step(batch, torch.device("cpu"))
    assert {"damping", "attempts", "accepted"} <= set(first.metrics)
    saved = loop.state_dict()
    assert saved["optimizer"] is None and saved["lma"]["steps"] == 1
    stopping = LMLoop(
        model, LMA(model, [torch.device("cpu")], lambda a, b: a - b, ftol=0.5), TrainConfig()
    )
    reasons = [stopping.step(batch, torch.device("cpu")).stop_reason for _ in range(20)]
    assert any(r is not None and r.startswith("LM terminated") for r in reasons)
    loop.load_state_dict(saved)
    assert lma.state_dict()["steps"] == 1


def test_each_loop_answers_for_its_dtype_scheduler_and_spawned_optimizer() -> None:
    # What the Trainer once asked by the loop's name, each loop answers for itself.
    from functools import partial

    from marquardt.solver import LMA

    config = TrainConfig(dtype=torch.float64)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    gradient = _gradient_loop(model, optimizer, config)
    assert gradient.dtype is torch.float64
    gradient.check_scheduler(torch.optim.lr_scheduler.StepLR(optimizer, step_size=2), config)
    copy = make_model()
    rebuilt = gradient.portable_optimizer().build(copy)
    assert isinstance(rebuilt, torch.optim.Adam)
    assert [p for g in rebuilt.param_groups for p in g["params"]] == list(copy.parameters())

    factory = partial(LMA, devices=[torch.device("cpu")], residual_fn=torch.sub)
    lm = LMLoop(model, factory, config)
    assert lm.dtype is None  # LM casts nothing, whatever the configuration's dtype
    lm.check_scheduler(None, config)
    with pytest.raises(ConfigError, match=r"LM has no learning rate.*HINT"):
        lm.check_scheduler(torch.optim.lr_scheduler.StepLR(optimizer, step_size=2), config)
    assert lm.portable_optimizer() is factory
    # The spawning process holds the factory only: taking a run's state back builds its LMA.
    trained = LMLoop(model, LMA(model, [torch.device("cpu")], torch.sub), TrainConfig())
    trained.step(_batches(64, 64), torch.device("cpu"))
    lm.load_state_dict(trained.state_dict())
    assert isinstance(lm.optimizer, LMA) and lm.optimizer.model is model
    assert lm.optimizer.state_dict()["steps"] == 1


# ---------------------------------------------------------------- the runner's schedule
def _loader(shuffle: bool = True) -> DataLoader:  # type: ignore[type-arg]
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    return DataLoader(TensorDataset(x, torch.sinc(3 * x)), batch_size=16, shuffle=shuffle)


def _fit_scheduled(
    folder: Path, make: Any, max_iter: int, **kw: Any
) -> tuple[Trainer, list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    lrs: list[float] = []

    def rate(trainer: Any, config: Any, writer: Any) -> None:
        lrs.append(optimizer.param_groups[0]["lr"])

    # called_every=1 on train_batch_end: every batch of epochs >= 1 (none in epoch 0)
    settings: dict[str, Any] = {"write_every": 1, **kw}
    config = TrainConfig(
        max_iter=max_iter,
        log_folder=folder,
        verbose=False,
        seed=0,
        callbacks=[Callback("train_batch_end", 1, rate)],
        **settings,
    )
    trainer = Trainer(model, optimizer, config, scheduler=make(optimizer))
    val = _loader(False) if config.val_every else None
    trainer.fit(_loader(), val)
    return trainer, lrs


def test_step_lr_per_epoch_and_per_step() -> None:
    def step_lr(opt: Any) -> Any:
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _, per_epoch = _fit_scheduled(Path(tmp) / "e", step_lr, 2)
        _, per_step = _fit_scheduled(Path(tmp) / "s", step_lr, 1, scheduler_interval="step")
    # 4 batches an epoch, seen from epoch 1 on: the rate halves after each epoch, or after
    # every step (steps 5-8 of epoch 1 have taken 5-8 halvings).
    assert per_epoch == [0.05] * 4 + [0.025] * 4
    assert per_step == pytest.approx([0.1 * 0.5**k for k in range(5, 9)])


def test_reduce_on_plateau_follows_the_validation_metric(tmp_path: Path) -> None:
    def plateau(opt: Any) -> Any:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)

    # lr 0.1 with val_every=1: the validation loss rises at some step, and the rate halves
    # right after that validation (patience 0), never before a validation.
    trainer, lrs = _fit_scheduled(tmp_path, plateau, 30, val_every=1)
    rows = [r for r in read_csv(tmp_path / "metrics.csv") if r["phase"] == "val"]
    vals = [float(r["val_loss"]) for r in rows]  # epochs 0 (before training), 1, 2, ...
    worse = [i for i in range(2, len(vals)) if vals[i] >= min(vals[1:i]) * (1 - 1e-4)]
    assert worse, vals
    epoch = int(rows[worse[0]]["epoch"])  # the rate halves after that epoch's validation
    per_epoch = [lrs[4 * (e - 1)] for e in range(1, 31)]
    assert per_epoch[epoch - 1] == 0.1 and per_epoch[epoch] == 0.05
    assert trainer.scheduler.num_bad_epochs == 0 or trainer.scheduler.best <= min(vals)


def test_a_plateau_scheduler_without_validation_is_refused(tmp_path: Path) -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"ReduceLROnPlateau watches.*val_every is 0.*HINT"):
        Trainer(
            model,
            opt,
            TrainConfig(root_folder=tmp_path),
            scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
        )
    with pytest.raises(ConfigError, match="built for another optimizer"):
        Trainer(
            model,
            opt,
            TrainConfig(root_folder=tmp_path),
            scheduler=torch.optim.lr_scheduler.StepLR(
                torch.optim.SGD(make_model().parameters()), 1
            ),
        )


def test_a_resumed_run_continues_the_learning_rate_schedule(tmp_path: Path) -> None:
    def multistep(opt: Any) -> Any:
        return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1, 3], gamma=0.1)

    straight, lrs = _fit_scheduled(tmp_path / "a", multistep, 5)
    _fit_scheduled(tmp_path / "b", multistep, 2, checkpoint_every=1)
    resumed, tail = _fit_scheduled(tmp_path / "b", multistep, 5, resume_from="latest")
    assert tail == lrs[8:]  # epochs 3-5 of 4 batches
    assert (
        resumed.scheduler.state_dict()["last_epoch"]
        == straight.scheduler.state_dict()["last_epoch"]
    )
    a = flat(straight.model)
    b = flat(resumed.model)
    assert torch.allclose(a, b, atol=1e-7)
    saved = ckpt.read_checkpoint(tmp_path / "b" / "checkpoints" / ckpt.checkpoint_name(12))
    assert saved["scheduler"]["last_epoch"] == 3


def test_checkpoint_best_only_keeps_best_and_no_numbered_checkpoint(tmp_path: Path) -> None:
    trainer, _ = _fit_scheduled(
        tmp_path,
        lambda opt: None,
        6,
        val_every=2,
        checkpoint_every=2,
        checkpoint_best_only=True,
        validation_criterion=lambda val, best, eps: val < best - eps,
    )
    folder = tmp_path / "checkpoints"
    assert [p.name for p in folder.iterdir()] == ["best.pt"]
    best = ckpt.read_checkpoint(folder / "best.pt")
    rows = [r for r in read_csv(tmp_path / "metrics.csv") if r["phase"] == "val"]
    vals = [float(r["val_loss"]) for r in rows if r["epoch"] != "0"]  # epochs 2, 4, 6
    assert best["best_val"] == pytest.approx(min(vals)) and best["step"] in (12, 20, 28)
    assert trainer.state.last_checkpoint == folder / "best.pt"


def test_wall_clock_budget_stops_every_rank_with_a_checkpoint(tmp_path: Path) -> None:
    import time

    def slow(trainer: Any, config: Any, writer: Any) -> None:
        time.sleep(0.05)

    budget = WallClockBudget(seconds=0.2)
    torch.manual_seed(0)
    model = make_model()
    config = TrainConfig(
        max_iter=1000,
        log_folder=tmp_path,
        verbose=False,
        callbacks=[Callback("train_batch_end", 1, slow), budget],
        checkpoint_best_only=True,  # the budget's stop still writes its resume point
    )
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
    trainer.fit(_loader())
    step = trainer.global_step
    assert 4 <= step < 50 and "wall-clock budget of 0.2 s spent" in trainer.state.stop_reason
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [step]
    with pytest.raises(ValueError, match=r"seconds must be a finite number > 0.*HINT"):
        WallClockBudget(seconds=0)


def test_an_lma_factory_builds_the_lma_in_the_process_and_is_checked(tmp_path: Path) -> None:
    import functools

    from marquardt.solver import LMA

    try:
        model = make_model()
        make_lma = functools.partial(LMA, devices=[torch.device("cpu")], residual_fn=torch.sub)
        config = TrainConfig(max_iter=2, log_folder=tmp_path, checkpoint_every=1, verbose=False)
        x = torch.linspace(-1, 1, 64).unsqueeze(1)
        loader = DataLoader(TensorDataset(x, torch.sinc(3 * x)), batch_size=64)
        out_model, lma = Trainer(model, make_lma, config).fit(loader)
        assert out_model is model and isinstance(lma, LMA) and lma.model is model
        assert lma.steps == 3 and lma.world_size == 1
        saved = ckpt.read_checkpoint(tmp_path / "checkpoints" / ckpt.checkpoint_name(3))
        assert saved["optimizer_class"] == "LMA" and saved["lm_report"]["rows"] == 64

        def not_an_lma(model: nn.Module, process_group: Any = None) -> Any:
            return torch.optim.SGD(model.parameters(), lr=0.1)

        with pytest.raises(ConfigError, match=r"returned a SGD, not an LMA.*HINT"):
            Trainer(make_model(), not_an_lma, config).fit(loader)

        def other_model(model: nn.Module, process_group: Any = None) -> Any:
            return LMA(make_model(), [torch.device("cpu")], torch.sub)

        with pytest.raises(ConfigError, match=r"an LMA for another model.*HINT"):
            Trainer(make_model(), other_model, config).fit(loader)
    finally:
        Trainer.set_use_grad(True)
