"""What a spawned process is built from: optimizer and LR scheduler specs (rebuilt around the
process's copy of the model) and a ``WorkerSpec`` that goes through ``Trainer``'s constructor."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.trainer import ConfigError, TrainConfig, Trainer
from marquardt.trainer._data._sources import DataSource
from marquardt.trainer._environments import ProcessLayout, SpawnedProcess
from marquardt.trainer._launch._spec import SchedulerSpec, WorkerSpec
from marquardt.trainer._loops._gradient import OptimizerSpec
from marquardt.trainer._persistence._plan import RunPlan
from marquardt.trainer.optimize_step import optimize_step


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))


def _stepped(make: Any, steps: int = 3) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = make(optimizer)
    for _ in range(steps):
        optimizer.step()
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(1.0)  # never improves: the rate falls after `patience` steps
        else:
            scheduler.step()
    return model, optimizer, scheduler


@pytest.mark.parametrize(
    "make",
    [
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[1, 4], gamma=0.1),
        lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=1),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
    ],
    ids=["StepLR", "MultiStepLR", "ReduceLROnPlateau", "CosineAnnealingLR"],
)
def test_a_scheduler_is_rebuilt_with_its_state_and_the_rate(make: Any) -> None:
    model, optimizer, scheduler = _stepped(make)
    specs = pickle.loads(
        pickle.dumps(
            (model, OptimizerSpec.capture(optimizer, model), SchedulerSpec.capture(scheduler))
        )
    )
    copy, optimizer_spec, scheduler_spec = specs
    rebuilt_optimizer = optimizer_spec.build(copy)
    rebuilt = scheduler_spec.build(rebuilt_optimizer)
    assert type(rebuilt) is type(scheduler) and rebuilt.optimizer is rebuilt_optimizer
    assert rebuilt.state_dict() == scheduler.state_dict()
    assert rebuilt_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    # The next steps follow the original's.
    for s in (scheduler, rebuilt):
        if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau):
            s.step(1.0)
        else:
            s.step()
    assert rebuilt_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


def test_a_scheduler_whose_settings_are_not_in_its_state_is_refused() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.9**epoch)
    with pytest.raises(ConfigError, match=r"LambdaLR cannot be rebuilt.*lr_lambda.*HINT"):
        SchedulerSpec.capture(scheduler)


def test_a_worker_spec_builds_its_trainer_through_the_constructor(tmp_path: Any) -> None:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    layout = ProcessLayout(1, 1, 2, 2, 0, "127.0.0.1", 29500)
    spec = WorkerSpec(
        trainer_class=Trainer,
        model=model,
        optimizer=OptimizerSpec.capture(optimizer, model),
        scheduler=None,
        config=TrainConfig(nprocs=2, root_folder=tmp_path, compute_setup="cpu"),
        loss_fn=nn.MSELoss(),
        optimize_step=optimize_step,
        data=DataSource([]),
        plan=RunPlan(str(tmp_path), None, 0),
        result_path="",
        launcher="spawn",
        gpu_count=0,
        use_gpu=False,
    )
    trainer = pickle.loads(pickle.dumps(spec)).build(layout)
    assert isinstance(trainer, Trainer) and not trainer.is_lm
    assert isinstance(trainer.environment, SpawnedProcess)
    assert trainer.environment.layouts() == [layout] and trainer.environment.name == "spawn"
    assert (trainer.environment.world_size, trainer.environment.local_processes) == (2, 2)
    assert isinstance(trainer.optimizer, torch.optim.Adam)
    own = {id(p) for p in trainer.model.parameters()}
    assert all(id(p) in own for g in trainer.optimizer.param_groups for p in g["params"])
    context = trainer.run_context()
    assert context.launcher == "spawn" and context.loop is trainer.loop
