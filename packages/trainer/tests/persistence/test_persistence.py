"""Persistence on its own: a run context saved and restored without ``Trainer.fit``, and the
run plan (folder layout, which checkpoint to resume)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from marquardt.trainer import CheckpointMismatchError, EarlyStopping, TrainConfig
from marquardt.trainer._compute import Compute
from marquardt.trainer._environments import ProcessLayout
from marquardt.trainer._loops._context import RunContext
from marquardt.trainer._loops._gradient import GradientLoop
from marquardt.trainer._loops._torch_lr_scheduler import LRSchedule
from marquardt.trainer._loss import resolve_loss
from marquardt.trainer._persistence import _files as ckpt
from marquardt.trainer._persistence._plan import RUN_NAME, plan_run
from marquardt.trainer._persistence._run_state import (
    Checkpoints,
    check_checkpoint,
    restore,
)
from marquardt.trainer._state import TrainerState
from marquardt.trainer.optimize_step import optimize_step

LAYOUT = ProcessLayout(0, 0, 1, 1, 0, "127.0.0.1", 0)


def _context(folder: Path, seed: int, stopper: EarlyStopping) -> RunContext:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    config = TrainConfig(root_folder=folder, callbacks=[stopper], val_every=1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    context = RunContext(
        config=config,
        state=TrainerState(),
        loop=GradientLoop(model, optimizer, resolve_loss("mse"), optimize_step, config),
        callbacks=config.callbacks,
        owner=None,
        schedule=LRSchedule(scheduler, config),
        loss_fn=resolve_loss("mse"),
        compute=Compute(use_gpu=False, backend="gloo"),
        launcher="plain",
        folder=folder,
        sampler_seed=1234,
    )
    context.checkpoints = Checkpoints(context)
    return context


def _train_a_little(context: RunContext) -> None:
    x = torch.linspace(-1, 1, 16).unsqueeze(1)
    for _ in range(3):
        context.loop.step([(x, torch.sin(3 * x))], torch.device("cpu"))
        context.schedule.after_step()
        context.schedule.after_epoch()
    context.state.step, context.state.epoch, context.state.batch_in_epoch = 3, 1, 2
    context.state.best_val = 0.25
    stopper = context.callbacks[0]
    assert isinstance(stopper, EarlyStopping)
    stopper.best, stopper.bad_validations = 0.25, 2


def test_a_saved_context_restores_into_a_fresh_one(tmp_path: Path) -> None:
    saved = _context(tmp_path, seed=0, stopper=EarlyStopping())
    _train_a_little(saved)
    assert saved.checkpoints is not None
    saved.checkpoints.save()
    path = saved.state.last_checkpoint
    assert path == tmp_path / "checkpoints" / ckpt.checkpoint_name(3)
    data = ckpt.read_checkpoint(path)
    fresh = _context(tmp_path, seed=7, stopper=EarlyStopping())
    check_checkpoint(
        data, path, fresh.model, fresh.loop.kind, fresh.loop.optimizer_name, fresh.callbacks
    )
    restore(fresh, data, LAYOUT)
    assert (fresh.state.step, fresh.state.epoch, fresh.state.batch_in_epoch) == (3, 1, 2)
    assert fresh.state.best_val == 0.25 and data["sampler_seed"] == 1234
    for a, b in zip(saved.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert fresh.loop.optimizer.state_dict()["state"][0]["step"] == 3
    assert fresh.schedule.state_dict() == saved.schedule.state_dict()
    assert fresh.loop.optimizer.param_groups[0]["lr"] == saved.loop.optimizer.param_groups[0]["lr"]
    stopper = fresh.callbacks[0]
    assert isinstance(stopper, EarlyStopping)
    assert (stopper.best, stopper.bad_validations) == (0.25, 2)


def test_a_checkpoint_of_another_loop_kind_or_callbacks_is_refused(tmp_path: Path) -> None:
    saved = _context(tmp_path, seed=0, stopper=EarlyStopping())
    _train_a_little(saved)
    assert saved.checkpoints is not None
    saved.checkpoints.save_best()
    path = tmp_path / "checkpoints" / ckpt.BEST_NAME
    data = ckpt.read_checkpoint(path)
    fresh = _context(tmp_path, seed=0, stopper=EarlyStopping())
    with pytest.raises(
        CheckpointMismatchError, match="written by the 'ddp' loop but this run uses the 'lm'"
    ):
        check_checkpoint(data, path, fresh.model, "lm", "Adam", [])
    with pytest.raises(CheckpointMismatchError, match="holds the state of callback"):
        check_checkpoint(data, path, fresh.model, "ddp", "Adam", [])


def test_the_run_folder_layout_and_the_checkpoint_to_resume(tmp_path: Path) -> None:
    config = TrainConfig(root_folder=tmp_path, seed=3)
    plan = plan_run(config)
    first = Path(plan.folder)
    assert (first.parent, plan.resume, plan.sampler_seed) == (tmp_path, None, 3)
    assert RUN_NAME.match(first.name) and first.name.startswith("1_")
    assert first.name.endswith(f"_{os.getpid():x}") and config._subfolders == [first.name]
    second = Path(plan_run(config).folder)  # the same configuration again: a new run beside
    assert second.parent == tmp_path and second.name.startswith("2_")
    given = tmp_path / "mine"
    assert plan_run(TrainConfig(log_folder=given)).folder == str(given)  # empty: used as is
    (given / "metrics.csv").parent.mkdir()
    (given / "metrics.csv").write_text("step\n")
    inside = Path(plan_run(TrainConfig(log_folder=given)).folder)  # holds a run: a subfolder
    assert inside.parent == given and inside.name.startswith("1_")
    run = tmp_path / "7_20260101T000000_1a"
    ckpt.atomic_save(
        {"format": ckpt.FORMAT, "version": ckpt.VERSION, "kind": "ddp", "step": 5, "model": {}},
        run / ckpt.CHECKPOINT_DIR / ckpt.checkpoint_name(5),
    )
    again = plan_run(TrainConfig(root_folder=tmp_path, resume_from="latest"))
    assert again.folder == str(run)  # continues in the folder of the interrupted run
    assert again.resume == str(run / ckpt.CHECKPOINT_DIR / ckpt.checkpoint_name(5))
    named = plan_run(TrainConfig(root_folder=tmp_path, resume_from=again.resume))
    assert named.folder == str(run)
