"""Checkpoints: atomic writes, a kill mid-write, and refusing missing, truncated or foreign files."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    TrainConfig,
    Trainer,
)
from marquardt.trainer._persistence import _files as ckpt

from ..conftest import SCRIPTS, Processes


def _model(hidden: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def _loader() -> DataLoader:  # type: ignore[type-arg]
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    return DataLoader(TensorDataset(x, torch.sin(3 * x)), batch_size=16)  # 2 steps an epoch


@contextlib.contextmanager
def _weights_kept(model: nn.Module) -> Iterator[None]:
    """Assert that ``model``'s parameters are the same after the block as before it."""
    before = [p.detach().clone() for p in model.parameters()]
    yield
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))


def _train(tmp_path: Path, model: nn.Module, **kw: object) -> Trainer:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    settings: dict[str, object] = {"max_iter": 1, "checkpoint_every": 1, **kw}
    config = TrainConfig(log_folder=tmp_path, verbose=False, **settings)  # type: ignore[arg-type]
    trainer = Trainer(model, optimizer, config)
    trainer.fit(_loader())
    return trainer


def _assert_resume_refused(
    folder: Path, model: nn.Module, checkpoint: Path, error: type[Exception], match: str
) -> None:
    """Assert that resuming ``model`` from ``checkpoint`` raises ``error`` and trains nothing."""
    with _weights_kept(model), pytest.raises(error, match=match):
        _train(folder, model, resume_from=checkpoint)


def test_atomic_save_crash_before_rename_keeps_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / ckpt.checkpoint_name(1)
    ckpt.atomic_save({"w": torch.ones(3)}, target)

    def crash(tmp: Path) -> None:
        raise OSError("disk full (injected)")

    monkeypatch.setattr(ckpt, "_before_rename", crash)
    with pytest.raises(OSError, match="injected"):
        ckpt.atomic_save({"w": torch.zeros(3)}, target)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no stray temporary file


def test_kill_during_write_leaves_previous_checkpoint_loadable(
    tmp_path: Path, procs: Processes
) -> None:
    marker = tmp_path / "frozen"
    proc = procs.start(
        [str(SCRIPTS / "write_interrupted.py"), str(tmp_path), str(marker)], cwd=tmp_path
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the writer never reached the middle of its write"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    partial = Path(marker.read_text())
    assert partial.exists() and partial.name.startswith(".")  # the half-written temporary file
    folder = tmp_path / ckpt.CHECKPOINT_DIR
    assert [s for s, _ in ckpt.list_checkpoints(folder)] == [1]
    first = folder / ckpt.checkpoint_name(1)
    assert torch.equal(ckpt.read_checkpoint(first)["model"]["w"], torch.full((1000,), 1.0))
    assert ckpt.find_latest(tmp_path, tmp_path) == first


def test_checkpoint_has_no_ddp_prefix_and_loads_weights_only(tmp_path: Path) -> None:
    model = _model()
    wrapped = nn.Module()
    wrapped.module = model  # what DDP's state_dict looks like: keys under "module."
    state = ckpt.strip_prefixes({f"module.{k}": v for k, v in model.state_dict().items()})
    assert set(state) == set(model.state_dict())
    trainer = _train(tmp_path, _model())
    path = trainer.state.last_checkpoint
    assert path is not None and path.name == ckpt.checkpoint_name(4)
    data = torch.load(path, weights_only=True)
    assert not any(k.startswith("module.") for k in data["model"])
    assert data["step"] == 4 and data["kind"] == "ddp" and data["optimizer_class"] == "SGD"
    assert {"torch", "random"} <= set(data["rng"][0])


def test_missing_checkpoint_fails_before_work(tmp_path: Path) -> None:
    _assert_resume_refused(
        tmp_path,
        _model(),
        tmp_path / "nope.pt",
        CheckpointNotFoundError,
        r"no such checkpoint file\. HINT",
    )
    assert not (tmp_path / "metrics.csv").exists()


def test_truncated_checkpoint_is_refused_and_names_an_older_one(tmp_path: Path) -> None:
    _train(tmp_path, _model(), max_iter=2)  # checkpoints after epochs 1 and 2: steps 4, 6
    folder = tmp_path / ckpt.CHECKPOINT_DIR
    latest = folder / ckpt.checkpoint_name(6)
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    _assert_resume_refused(
        tmp_path / "other",
        _model(),
        latest,
        CheckpointCorruptError,
        r"cannot be read: it is truncated.*HINT: resume from an earlier "
        r"checkpoint \(ckpt_000000004.pt\)",
    )
    # "latest" skips the damaged file with a warning and resumes from the one before.
    with pytest.warns(RuntimeWarning, match="trying an older checkpoint"):
        assert ckpt.find_latest(tmp_path) == folder / ckpt.checkpoint_name(4)


def test_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    _train(tmp_path, _model(hidden=8))
    path = tmp_path / ckpt.CHECKPOINT_DIR / ckpt.checkpoint_name(4)
    _assert_resume_refused(
        tmp_path / "b",
        _model(hidden=5),
        path,
        CheckpointMismatchError,
        r"written for another model \(different shapes: 0.bias \[8\] vs \[5\].*HINT",
    )


def test_checkpoint_of_another_optimizer_is_refused(tmp_path: Path) -> None:
    _train(tmp_path, _model())
    path = tmp_path / ckpt.CHECKPOINT_DIR / ckpt.checkpoint_name(4)
    model = _model()
    with _weights_kept(model):
        config = TrainConfig(max_iter=8, log_folder=tmp_path / "c", resume_from=path, verbose=False)
        trainer = Trainer(model, torch.optim.Adam(model.parameters()), config)
        with pytest.raises(
            CheckpointMismatchError, match="holds the state of a SGD but this run uses a Adam"
        ):
            trainer.fit(_loader())


def test_a_plain_torch_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save(_model().state_dict(), path)
    with pytest.raises(CheckpointCorruptError, match=r"not a marquardt\.trainer checkpoint"):
        ckpt.read_checkpoint(path)


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    _train(tmp_path, _model(), max_iter=3, keep_checkpoints=2)  # epochs 1, 2, 3: steps 4, 6, 8
    steps = [s for s, _ in ckpt.list_checkpoints(tmp_path / ckpt.CHECKPOINT_DIR)]
    assert steps == [6, 8]


def test_rng_state_round_trip() -> None:
    import random

    import numpy as np

    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    state = ckpt.rng_state()
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(2)
    random.seed(2)
    np.random.seed(2)
    ckpt.set_rng_state(state)
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]
