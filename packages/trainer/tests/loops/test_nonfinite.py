"""A diverging run, or a batch with an infinite loss, under each ``on_nonfinite`` choice:
the gradient loop in one process and in two (gloo), and the LM loop. The checkpoints kept
are always finite. The script trains epochs of 4 batches, one step per batch, and writes a
checkpoint after every epoch from epoch 1 on (perceptrain's counting): the first one is
``ckpt_8``, and a fault in epoch ``e >= 2`` finds the last one at step ``4 e``."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.testing.processes import free_port
from marquardt.trainer import Callback, ConfigError, NonFiniteLossError, TrainConfig, Trainer
from marquardt.trainer._persistence import _files as ckpt

from ..conftest import SCRIPTS, Processes, clean_env, start_srun_tasks

SCRIPT = SCRIPTS / "nonfinite.py"
BATCHES = 4  # per epoch, one step each (the script's --batches)


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("marquardt_test_nonfinite", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_here(cwd: Path, *args: str) -> dict[str, Any]:
    """The script in this process (one training process); its outcome."""
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        _script().main([*args, "--out", "here"])
    finally:
        os.chdir(previous)
    result: dict[str, Any] = json.loads((cwd / "here-rank0.json").read_text())
    return result


def _run_folder(root: Path) -> Path:
    """The one run under ``root`` (a new run gets a subfolder ``<n>_<time>_<pid>``)."""
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


def _kept_checkpoints_are_finite(run: Path, keep: int = 3) -> list[int]:
    found = ckpt.list_checkpoints(run / "checkpoints")
    assert 1 <= len(found) <= keep
    for _, path in found:
        state = ckpt.read_checkpoint(path)["model"]
        assert all(bool(torch.isfinite(v).all()) for v in state.values()), path
    return [step for step, _ in found]


def test_config_refuses_an_unknown_choice() -> None:
    with pytest.raises(ConfigError, match="on_nonfinite must be one of 'stop', 'skip'"):
        TrainConfig(on_nonfinite="ignore")


def test_a_diverging_run_stops_at_once_naming_step_batch_and_last_checkpoint(
    tmp_path: Path,
) -> None:
    out = _run_here(tmp_path, "--fault", "diverge", "--policy", "stop")
    assert "finished" not in out
    step, epoch, batch = out["step"], out["epoch"], out["batch"]
    assert step > 1 and f"step {step} (epoch {epoch}, batch {batch})" in out["error"]
    assert step == epoch * BATCHES + batch + 1  # one batch per step
    assert epoch >= 2  # after the first checkpoint, written at the end of epoch 1
    assert "HINT:" in out["error"]
    last = Path(tmp_path / out["last_checkpoint"])
    assert (
        last.name == ckpt.checkpoint_name(epoch * BATCHES)  # at the end of the epoch before
        and str(last.relative_to(tmp_path)) in out["error"]
    )
    steps = _kept_checkpoints_are_finite(_run_folder(tmp_path / "qml_logs"))
    assert steps[-1] == epoch * BATCHES  # nothing written after the fault


def test_continue_goes_on_but_never_rotates_finite_checkpoints_out(tmp_path: Path) -> None:
    out = _run_here(tmp_path, "--fault", "diverge", "--policy", "continue", "--epochs", "30")
    assert out["epochs"] == 31 and out["finished"] == 31 * BATCHES and not out["finite"]
    steps = _kept_checkpoints_are_finite(_run_folder(tmp_path / "qml_logs"))
    assert steps[-1] < 31 * BATCHES  # the last finite ones, from before the fault


def test_skip_undoes_the_step_and_skips_the_batch(tmp_path: Path) -> None:
    out = _run_here(tmp_path, "--fault", "poison", "--policy", "skip", "--epochs", "30")
    # every epoch's batch 2 is skipped: 31 epochs of 3 steps, the last one checkpointed
    assert out["epochs"] == 31 and out["finished"] == 31 * (BATCHES - 1) and out["finite"]
    assert _kept_checkpoints_are_finite(_run_folder(tmp_path / "qml_logs"))[-1] == 31 * 3


def test_a_skipped_batch_begins_for_hooks_but_only_a_step_taken_ends(tmp_path: Path) -> None:
    """Hooks see every batch begin; only steps taken end, the one after a skip carrying
    ``skipped_batches``."""
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    y = torch.sin(x)
    y[17] = float("inf")  # batch 2 of 4, every epoch

    starts: list[Any] = []
    ends: list[dict[str, Any]] = []

    class Watched(Trainer):
        def on_train_batch_start(self, batch: Any) -> None:
            starts.append(batch)

        def on_train_batch_end(self, train_batch_loss_metrics: Any) -> None:
            ends.append(dict(train_batch_loss_metrics[1]))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
    config = TrainConfig(max_iter=1, root_folder=tmp_path, on_nonfinite="skip",
                         verbose=False, seed=0)  # fmt: skip
    trainer = Watched(model, torch.optim.SGD(model.parameters(), lr=0.05), config)
    trainer.fit(train_dataset=TensorDataset(x, y), batch_size=8, shuffle=False)
    assert len(starts) == 2 * 4 and len(ends) == 2 * 3 == trainer.state.step
    carried = [m.get("train_skipped_batches") for m in ends]
    assert carried == [None, None, 1.0, None, None, 1.0]


def test_stop_names_the_batch_with_the_infinite_loss(tmp_path: Path) -> None:
    out = _run_here(tmp_path, "--fault", "poison", "--policy", "stop")
    assert (out["step"], out["epoch"], out["batch"]) == (3, 0, 2)  # sample 17 of batch 16-23


def test_a_resumed_run_names_the_checkpoint_it_resumed_from(tmp_path: Path) -> None:
    """A fault before the resumed run writes a checkpoint of its own: the last finite
    checkpoint is the one the run resumed from."""
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    clean, poisoned = TensorDataset(x, torch.sin(x)), TensorDataset(x, torch.sin(x))
    poisoned.tensors[1][17] = float("inf")  # batch 2 of every epoch

    def fit(max_iter: int, data: TensorDataset, resume: str | None) -> Trainer:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
        config = TrainConfig(max_iter=max_iter, root_folder=tmp_path, checkpoint_every=1,
                             resume_from=resume, verbose=False, seed=0)  # fmt: skip
        trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), config)
        trainer.fit(train_dataset=data, batch_size=8, shuffle=False)
        return trainer

    first = fit(1, clean, None).state.last_checkpoint  # epochs 0 and 1: ckpt_8
    assert first is not None and first.name == ckpt.checkpoint_name(8)
    with pytest.raises(NonFiniteLossError) as caught:
        fit(3, poisoned, "latest")
    err = caught.value
    assert (err.step, err.epoch, err.batch) == (11, 2, 2)
    assert err.last_checkpoint == str(first) and f"the last checkpoint, {first}" in str(err)


def _two_ranks(procs: Processes, cwd: Path, *args: str) -> list[dict[str, Any]]:
    """The script as the two tasks of one srun step (one process each), gloo on CPU."""
    started = start_srun_tasks(procs, [str(SCRIPT), *args, "--nprocs", "2", "--out", "two"], cwd)
    for proc in started:
        code, out, err = procs.wait(proc, timeout=120)
        assert code == 0, f"{out}\n{err}"
    return [json.loads((cwd / f"two-rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.multiprocess
def test_two_processes_stop_at_the_same_step(tmp_path: Path, procs: Processes) -> None:
    ranks = _two_ranks(procs, tmp_path, "--fault", "diverge", "--policy", "stop")
    assert all("error" in r for r in ranks), ranks
    assert ranks[0]["step"] == ranks[1]["step"] and ranks[0]["batch"] == ranks[1]["batch"]
    assert ranks[0]["last_checkpoint"] is not None
    assert "rank 0 writes the checkpoints" in ranks[1]["error"]
    steps = _kept_checkpoints_are_finite(_run_folder(tmp_path / "qml_logs"))
    assert Path(ranks[0]["last_checkpoint"]).name == ckpt.checkpoint_name(steps[-1])


@pytest.mark.multiprocess
def test_two_processes_skip_the_batch_only_rank_1_finds_infinite(
    tmp_path: Path, procs: Processes
) -> None:
    """Sample 17 is rank 1's alone: both ranks undo the same steps (DDP's averaged
    gradient is not finite on either) and the two replicas end identical and finite."""
    ranks = _two_ranks(procs, tmp_path, "--fault", "poison", "--policy", "skip", "--epochs", "5")
    assert ranks[0]["finished"] == ranks[1]["finished"] == 6 * (BATCHES - 1)
    assert ranks[0]["finite"] and ranks[0]["params"] == ranks[1]["params"]


@pytest.mark.multiprocess
def test_a_spawned_run_raises_the_non_finite_error_itself(tmp_path: Path, procs: Processes) -> None:
    """``nprocs=2`` under plain python (a spawn): the caller catches ``NonFiniteLossError``
    with its step, epoch and batch, as without a spawn, not only ``WorkerFailedError``."""
    proc = procs.start(
        [str(SCRIPT), "--fault", "poison", "--policy", "stop", "--nprocs", "2", "--out", "spawn"],
        cwd=tmp_path,
        env=clean_env(MASTER_PORT=str(free_port())),
    )
    code, out, err = procs.wait(proc, timeout=180)
    assert code == 0, f"{out}\n{err}"
    outcome = json.loads((tmp_path / "spawn-rank0.json").read_text())
    assert (outcome["step"], outcome["epoch"], outcome["batch"]) == (3, 0, 2), outcome
    assert "HINT:" in outcome["error"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_lm_in_two_processes_a_residual_only_rank_1_finds_infinite(
    tmp_path: Path, procs: Processes, policy: str
) -> None:
    """The LM loop over a process group, sample 17's residual infinite on rank 1 alone: both
    ranks refuse the batch in the same step (no collective left waiting) and stop there
    together, or skip it together and end with the same finite parameters."""
    pytest.importorskip("marquardt.solver", reason="the LM loop needs marquardt-solver")
    args = ["--loop", "lm", "--fault", "poison", "--policy", policy, "--epochs", "3"]
    started = time.monotonic()
    ranks = _two_ranks(procs, tmp_path, *args)
    assert time.monotonic() - started < 90  # not a collective's timeout (dist_timeout)
    if policy == "stop":
        assert all("error" in r for r in ranks), ranks
        assert [(r["step"], r["epoch"], r["batch"]) for r in ranks] == [(3, 0, 2)] * 2
        assert "sample" in ranks[1]["error"]  # the rank whose residual it is names it
    else:
        assert ranks[0]["finished"] == ranks[1]["finished"] == 4 * (BATCHES - 1)
        assert ranks[0]["finite"] and ranks[0]["params"] == ranks[1]["params"]


def _lm_trainer(tmp_path: Path, policy: str) -> tuple[Trainer, DataLoader, nn.Module]:  # type: ignore[type-arg]
    pytest.importorskip("marquardt.solver", reason="the LM loop needs marquardt-solver")
    from marquardt.solver import LMA

    x = torch.linspace(0.0, 1.0, 40, dtype=torch.float64).reshape(-1, 1)
    # A little noise, so that no batch is fitted exactly and LM goes on past epoch 1.
    y = torch.exp(2.0 * x) + 1e-3 * torch.sin(50.0 * x)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)  # 5 batches, one step each

    def poison(trainer: Any, config: Any, writer: Any) -> None:
        x[16:20] = 2000.0  # from epoch 2 on, batch 2 (samples 16-23) overflows exp

    model = _script().Exp()  # exp(w·x), w = 1, float64
    lma = LMA(model, ["cpu"], residual_fn=torch.sub)
    config = TrainConfig(
        max_iter=10,
        root_folder=tmp_path,
        checkpoint_every=1,  # the first at the end of epoch 1, step 10
        on_nonfinite=policy,
        verbose=False,
        callbacks=[Callback(on="train_epoch_end", callback=poison)],
    )
    return Trainer(model, lma, config), loader, model


def test_lm_loop_stops_at_a_batch_with_non_finite_residuals(tmp_path: Path) -> None:
    trainer, loader, model = _lm_trainer(tmp_path, "stop")
    with pytest.raises(NonFiniteLossError) as caught:
        trainer.fit(loader)
    err = caught.value
    assert (err.step, err.epoch, err.batch) == (13, 2, 2)
    assert "are NaN or infinite" in str(err) and err.last_checkpoint is not None
    assert err.last_checkpoint.endswith(ckpt.checkpoint_name(10))
    assert _kept_checkpoints_are_finite(_run_folder(tmp_path)) == [10]
    assert bool(torch.isfinite(model.w).all())  # the LMA refused the batch: θ untouched


def test_lm_loop_skips_a_batch_with_non_finite_residuals(tmp_path: Path) -> None:
    trainer, loader, model = _lm_trainer(tmp_path, "skip")
    trainer.fit(loader)
    assert trainer.state.step > 13  # past the batch that was skipped (LM may end earlier)
    assert abs(float(model.w.detach()) - 2.0) < 1e-3
    _kept_checkpoints_are_finite(_run_folder(tmp_path))


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_lm_loop_meets_a_batch_with_a_nan_target(tmp_path: Path, policy: str) -> None:
    """The LMA refuses a batch holding a NaN target (BatchNotFiniteError, its data check):
    on_nonfinite treats it as a non-finite batch, as the gradient loop does."""
    pytest.importorskip("marquardt.solver", reason="the LM loop needs marquardt-solver")
    from marquardt.solver import LMA

    x = torch.linspace(0.0, 1.0, 40, dtype=torch.float64).reshape(-1, 1)
    y = torch.exp(2.0 * x) + 1e-3 * torch.sin(50.0 * x)
    y[18] = float("nan")  # batch 2 of 5, every epoch
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = _script().Exp()  # exp(w·x), w = 1, float64
    config = TrainConfig(max_iter=2, root_folder=tmp_path, on_nonfinite=policy, verbose=False)
    trainer = Trainer(model, LMA(model, ["cpu"], residual_fn=torch.sub), config)
    if policy == "stop":
        with pytest.raises(NonFiniteLossError, match="finite targets") as caught:
            trainer.fit(loader)
        assert (caught.value.step, caught.value.epoch, caught.value.batch) == (3, 0, 2)
        return
    trainer.fit(loader)
    assert 3 <= trainer.state.step <= 3 * 4  # batch 2 skipped each epoch (LM may end early)
    assert abs(float(model.w.detach()) - 2.0) < 1e-3


def test_the_finiteness_check_finds_one_bad_entry_and_is_not_fooled_by_a_large_sum() -> None:
    from marquardt.trainer._loops._nonfinite import finite_model

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    assert finite_model(model)
    for bad in (float("nan"), float("inf"), float("-inf")):
        with torch.no_grad():
            model[1].running_var[2] = bad  # a buffer counts as much as a parameter
        assert not finite_model(model)
    huge = nn.Linear(4, 1).double()
    with torch.no_grad():
        huge.weight.fill_(1.7e308)  # finite entries whose sum overflows
    assert finite_model(huge)


@pytest.mark.parametrize(
    ("policy", "batches", "found_at"), [("stop", 8, 8), ("stop", 48, 32), ("skip", 48, 3)]
)
def test_a_model_made_non_finite_behind_a_finite_loss_is_found_lazily(
    tmp_path: Path, policy: str, batches: int, found_at: int
) -> None:
    """Under "stop" the model is read after every ``MODEL_CHECK_EVERY``-th step and after
    each epoch's last one: a buffer the loss never reads, made NaN after step 2, is found
    at the epoch's end (8 steps) or at step 32 (48 steps), not at step 3. "skip" reads it
    after every step (step 3 is undone, and every later one, until the run stops)."""
    from marquardt.trainer._loops._nonfinite import MODEL_CHECK_EVERY

    assert MODEL_CHECK_EVERY == 32
    model = nn.Linear(1, 1)
    model.register_buffer("unread", torch.zeros(2))

    class Poisoning(Trainer):
        def on_train_batch_end(self, train_batch_loss_metrics: Any) -> None:
            if self.state.step == 2:
                model.unread.fill_(float("nan"))

    x = torch.linspace(-1, 1, batches).unsqueeze(1)
    config = TrainConfig(
        max_iter=0, root_folder=tmp_path, verbose=False, seed=0, on_nonfinite=policy
    )
    trainer = Poisoning(model, torch.optim.SGD(model.parameters(), lr=0.01), config)
    with pytest.raises(NonFiniteLossError, match="parameters are not finite") as caught:
        trainer.fit(train_dataset=TensorDataset(x, 2 * x), batch_size=1, shuffle=False)
    assert caught.value.step == found_at
