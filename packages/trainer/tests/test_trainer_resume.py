"""Resuming a run: from its checkpoint, in a shared run folder, after a Slurm requeue or
a SIGTERM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from marquardt.testing.models import flat
from marquardt.trainer import Callback, TrainConfig, Trainer
from marquardt.trainer._persistence import _files as ckpt

from .conftest import read_csv
from .training import checkpoint_steps, full_loss, make_config, make_model, sinc_loader

pytestmark = pytest.mark.usefixtures("restore_use_grad")


def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path) -> None:
    straight = make_model()
    Trainer(
        straight,
        torch.optim.Adam(straight.parameters(), lr=0.01),
        make_config(tmp_path / "a", max_iter=4),
    ).fit(sinc_loader(shuffle=True))
    first = make_model()
    Trainer(
        first,
        torch.optim.Adam(first.parameters(), lr=0.01),
        make_config(tmp_path / "b", max_iter=2, checkpoint_every=1),
    ).fit(sinc_loader(shuffle=True))
    second = make_model(seed=5)  # different initial weights: everything must come from the file
    trainer = Trainer(
        second,
        torch.optim.Adam(second.parameters(), lr=0.01),
        make_config(tmp_path / "b", max_iter=4, resume_from="latest"),
    )
    trainer.fit(sinc_loader(shuffle=True))
    assert (trainer.global_step, trainer.current_epoch) == (40, 4)
    assert trainer.config.log_folder == tmp_path / "b"  # resumed in the run's folder
    assert abs(full_loss(second) - full_loss(straight)) < 1e-6
    assert torch.allclose(flat(second), flat(straight), atol=1e-6)
    epochs = [int(r["epoch"]) for r in read_csv(tmp_path / "b" / "metrics.csv")]
    # the CSV continues after the rows of the first fit (which ended with epoch 2 again)
    assert epochs == [1, 2, 2, 3, 4, 4]


def test_two_runs_into_one_folder_keep_both_whole_and_resume_the_named_run(
    tmp_path: Path,
) -> None:
    def run(max_iter: int, **kw: Any) -> Trainer:
        model = make_model()
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
        trainer.fit(sinc_loader(batch_size=32))
        return trainer

    first = Path(run(4).config.log_folder)
    second = Path(run(2).config.log_folder)
    assert first != second and first.parent == second.parent == tmp_path
    assert first.name.startswith("1_") and second.name.startswith("2_")
    assert len(read_csv(first / "metrics.csv")) == 5 and checkpoint_steps(first) == [4, 6, 8, 10]
    assert len(read_csv(second / "metrics.csv")) == 3 and checkpoint_steps(second) == [4, 6]
    # "latest" resumes the newest run, in its own folder; the first run stays whole.
    resumed = run(3, resume_from="latest")
    assert Path(resumed.config.log_folder) == second and resumed.global_step == 8
    assert checkpoint_steps(second) == [4, 6, 8] and len(read_csv(second / "metrics.csv")) == 5
    assert len(read_csv(first / "metrics.csv")) == 5 and checkpoint_steps(first) == [4, 6, 8, 10]
    # A checkpoint path resumes the run it belongs to.
    named = run(5, resume_from=first / "checkpoints" / ckpt.checkpoint_name(10))
    assert Path(named.config.log_folder) == first and named.global_step == 12
    assert checkpoint_steps(first) == [4, 6, 8, 10, 12]
    assert [int(r["epoch"]) for r in read_csv(first / "metrics.csv")] == [1, 2, 3, 4, 4, 5, 5]
    assert checkpoint_steps(second) == [4, 6, 8]


def test_requeued_slurm_job_resumes_without_being_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model()
    Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_config(tmp_path, max_iter=2, checkpoint_every=1),
    ).fit(sinc_loader())
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    trainer = Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), make_config(tmp_path, max_iter=3)
    )
    trainer.fit(sinc_loader())
    rows = list(read_csv(tmp_path / "metrics.csv"))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 2, 3, 3]
    assert trainer.global_step == 32


def test_sigterm_in_process_checkpoints_and_exits_zero(tmp_path: Path) -> None:
    import os
    import signal

    def term(trainer: Any, config: Any, writer: Any) -> None:
        if trainer.global_step == 11:
            os.kill(os.getpid(), signal.SIGTERM)

    model = make_model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_config(tmp_path, max_iter=50, callbacks=[Callback("train_batch_end", 1, term)]),
    )
    with pytest.raises(SystemExit) as exit_info:
        trainer.fit(sinc_loader())
    assert exit_info.value.code == 0
    assert trainer.state.interrupted and trainer.global_step == 11
    assert (tmp_path / "checkpoints" / "ckpt_000000011.pt").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler removed afterwards
