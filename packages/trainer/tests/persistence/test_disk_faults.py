"""Files the run cannot write: a full disk, a read-only or forbidden folder, a used-up
quota, for checkpoints, ``hparams.json``, ``metrics.csv``, TensorBoard and MLflow. Each
ends in one `RunFilesError` naming the file, the room needed and free, the last intact
checkpoint and a HINT; no file is left half-written."""

from __future__ import annotations

import csv
import errno
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import (
    CheckpointWriteError,
    MLflowLogger,
    RunFilesError,
    TrainConfig,
    Trainer,
)
from marquardt.trainer import _disk as disk
from marquardt.trainer._persistence import _files as ckpt

from ..faults import FaultyFiles, chmod_protects, small_disk


def _model(hidden: int = 48) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                         nn.Tanh(), nn.Linear(hidden, 1))  # fmt: skip


def _loader() -> DataLoader:  # type: ignore[type-arg]
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    return DataLoader(TensorDataset(x, torch.sin(3 * x)), batch_size=8)


def _trainer(folder: Path, model: nn.Module, **kw: Any) -> Trainer:
    options: dict[str, Any] = {
        "max_iter": 12,
        "root_folder": folder,
        "create_subfolder_per_run": False,
        "checkpoint_every": 1,
        "verbose": False,
        **kw,
    }
    return Trainer(model, torch.optim.Adam(model.parameters(), lr=1e-3), TrainConfig(**options))


def _run_folder(root: Path) -> Path:
    """The one run under ``root`` (a new run gets a subfolder ``<n>_<time>_<pid>``)."""
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


def _no_stray_files(folder: Path) -> None:
    stray = [p.name for p in folder.rglob("*") if ".tmp" in p.name]
    assert not stray, f"half-written files left: {stray}"


@pytest.mark.parametrize("kind", ["tmpfs", "injected"])
def test_a_full_disk_stops_with_one_clear_error_and_keeps_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    model = _model()
    one = disk.estimate_bytes({"model": model.state_dict(), "adam": model.state_dict()})
    with small_disk(tmp_path, monkeypatch, 3 * one, kind) as folder:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the low-space warning
            with pytest.raises(CheckpointWriteError) as caught:
                _trainer(folder, model).fit(_loader())
        err = caught.value
        text = str(err)
        assert err.errno == errno.ENOSPC
        assert isinstance(err, OSError)
        assert err.path.endswith(".pt") and err.path in text
        assert err.needed is not None and err.free is not None and err.free < err.needed
        assert "No space left on device" in text and "HINT:" in text
        assert err.last_checkpoint is not None and err.last_checkpoint in text
        assert "resume_from='latest'" in text
        # torch's own message is not what the user sees first, but it is kept as the cause
        assert err.__cause__ is not None
        data = ckpt.read_checkpoint(err.last_checkpoint)  # whole, and loads
        assert data["step"] >= 1
        _no_stray_files(folder)


def test_torch_s_enforce_fail_without_an_errno_is_read_from_the_free_space(
    tmp_path: Path,
) -> None:
    """torch writing a file itself loses the errno: the free space tells it was ENOSPC."""
    lost = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    target = tmp_path / "checkpoints" / ckpt.checkpoint_name(2)
    free = disk.free_bytes(tmp_path)
    assert free is not None
    err = disk.write_error(
        "checkpoint", target, lost, needed=free + 1, last_checkpoint=tmp_path / "a.pt"
    )
    assert err is not None and err.errno == errno.ENOSPC
    assert "No space left on device" in str(err) and "enforce fail" in str(err)
    assert disk.write_error("checkpoint", target, RuntimeError("a bug of ours")) is None


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (errno.EROFS, "read-only"),
        (errno.EACCES, "permissions"),
        (errno.EDQUOT, "quota"),
    ],
    ids=["read-only", "permission", "quota"],
)
def test_a_folder_that_refuses_writes_fails_before_the_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, hint: str
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    if code == errno.EACCES and chmod_protects():
        folder.chmod(0o500)  # a real folder without write permission
    else:
        FaultyFiles(folder, errno=code).install(monkeypatch)
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    try:
        with pytest.raises(RunFilesError) as caught:
            _trainer(folder, model).fit(_loader())
    finally:
        folder.chmod(0o700)
    err = caught.value
    assert err.errno == code
    assert str(folder) in str(err) and hint in str(err) and "HINT:" in str(err)
    assert "No checkpoint of this run is on disk yet" in str(err)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))


def test_a_warning_when_the_disk_holds_fewer_than_two_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model()
    size = disk.checkpoint_bytes(model, {})
    # Only the reported free space is small: every write succeeds.
    small = FaultyFiles(tmp_path, budget=int(1.5 * size))
    monkeypatch.setattr(disk.shutil, "disk_usage", small.disk_usage)
    with pytest.warns(RuntimeWarning, match="fewer than two checkpoints of this model"):
        _trainer(tmp_path / "run", model, max_iter=2).fit(_loader())


def test_metrics_csv_on_a_full_disk_keeps_whole_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "run"
    layer = FaultyFiles(folder, budget=150, only="metrics.csv").install(monkeypatch)
    with pytest.raises(RunFilesError) as caught:
        _trainer(folder, _model(), tracking_tool=["csv"], write_every=1).fit(_loader())
    assert layer.budget == 0
    err = caught.value
    assert err.errno == errno.ENOSPC and err.path.endswith("metrics.csv")
    assert "CSVLogger output" in str(err) and err.last_checkpoint is not None
    monkeypatch.undo()
    metrics = _run_folder(folder) / "metrics.csv"
    assert err.path == str(metrics)
    with open(metrics, newline="") as handle:
        rows = list(csv.reader(handle))
    assert len(rows) >= 2 and all(len(r) == len(rows[0]) for r in rows), rows
    assert metrics.read_text().endswith("\n")


def test_tensorboard_on_a_read_only_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    folder = tmp_path / "run"
    FaultyFiles(folder, errno=errno.EROFS, only="tensorboard").install(monkeypatch)
    with pytest.raises(RunFilesError) as caught:
        _trainer(folder, _model(), tracking_tool=["tensorboard"]).fit(_loader())
    assert caught.value.errno == errno.EROFS
    assert "TensorBoardLogger output" in str(caught.value)
    assert str(_run_folder(folder) / "tensorboard") in str(caught.value)


def test_mlflow_file_store_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    folder = tmp_path / "run"
    FaultyFiles(folder, budget=0, only="mlruns").install(monkeypatch)
    logger = MLflowLogger(in_run_folder=True)  # the store in the run folder: the full disk's
    with pytest.raises(RunFilesError) as caught:
        _trainer(folder, _model(), tracking_tool=[logger]).fit(_loader())
    assert caught.value.errno == errno.ENOSPC
    assert "MLflowLogger output" in str(caught.value)
