"""``Trainer.callback_manager`` (perceptrain's ``CallbacksManager`` role) and its ``writer``:
a callback written for perceptrain logs through ``trainer.callback_manager.writer`` into the
run's loggers (CSV, and MLflow against its local file store), and ``writer.run`` is the
MLflow run. The TensorBoard side is compared against perceptrain itself in
``integration_tests/perceptrain/callback_writer.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import (
    Callback,
    CallbacksManager,
    MLflowLogger,
    PrintMetrics,
    TrainConfig,
    Trainer,
    WriteMetrics,
)

from ..conftest import read_csv


class LogsThroughTheManager(Callback):
    """A callback as a perceptrain user writes it: it reaches the writer through the
    trainer, outside the ``writer`` argument, and logs a number of its own."""

    def __init__(self) -> None:
        super().__init__(on="train_epoch_end", called_every=1)
        self.writers: list[Any] = []

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        self.writers.append(writer)
        epoch = trainer.opt_result.iteration
        trainer.callback_manager.writer.write(epoch, {"custom_square": float(epoch**2)})


def _trainer(tmp_path: Path, tracking: Any, callback: Callback) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
    config = TrainConfig(
        max_iter=3,
        log_folder=tmp_path,
        write_every=1,
        tracking_tool=tracking,
        callbacks=[callback],
        hyperparams={"width": 4},
    )
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config)


def _loader() -> DataLoader[Any]:
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    return DataLoader(TensorDataset(x, torch.sin(3 * x)), batch_size=16)


def test_before_fit_the_manager_holds_the_configured_callbacks_and_no_writer(
    tmp_path: Path,
) -> None:
    callback = LogsThroughTheManager()
    trainer = _trainer(tmp_path, "csv", callback)
    manager = trainer.callback_manager
    assert isinstance(manager, CallbacksManager)
    assert manager.callbacks == [callback] and manager.writer is None
    assert manager.config is trainer.config


def test_a_callback_logs_through_the_manager_s_writer_into_the_csv(tmp_path: Path) -> None:
    callback = LogsThroughTheManager()
    trainer = _trainer(tmp_path, "csv", callback)
    trainer.fit(_loader())
    manager = trainer.callback_manager
    # the run's manager: the callback, then the configuration's built-ins, one writer
    assert manager.callbacks[0] is callback
    assert any(isinstance(c, WriteMetrics) for c in manager.callbacks)
    assert not any(isinstance(c, PrintMetrics) for c in manager.callbacks)  # print_every=0
    assert [id(w) for w in callback.writers] == [id(manager.writer)] * 3  # epochs 1, 2, 3
    rows = read_csv(Path(trainer.config.log_folder) / "metrics.csv")
    custom = [(int(r["epoch"]), float(r["custom_square"])) for r in rows if r["custom_square"]]
    assert custom == [(1, 1.0), (2, 4.0), (3, 9.0)]
    assert manager.writer.run is None  # no MLflow among the tracking tools


def test_writer_run_is_the_mlflow_run_that_holds_what_the_callback_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it, opt-in
    uri = (tmp_path / "mlruns").as_uri()
    callback = LogsThroughTheManager()
    trainer = _trainer(
        tmp_path / "run", ["csv", MLflowLogger(tracking_uri=uri, experiment="cm")], callback
    )
    trainer.fit(_loader())
    run = trainer.callback_manager.writer.run
    client = MlflowClient(tracking_uri=uri)
    stored = client.get_run(run.info.run_id)
    assert stored.info.experiment_id == run.info.experiment_id
    assert stored.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "custom_square")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 4.0), (3, 9.0)]
    assert stored.data.params["width"] == "4"


def test_a_figure_named_as_a_file_keeps_its_name_in_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlflow.tracking import MlflowClient

    def error_plot(model: nn.Module, iteration: int) -> tuple[str, Any]:
        figure, axes = plt.subplots()
        axes.plot([0, 1], [0, iteration])
        return f"error_epoch_{iteration}.png", figure

    def curve(model: nn.Module, iteration: int) -> tuple[str, Any]:
        return "curve", plt.subplots()[0]

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    config = TrainConfig(
        max_iter=2,
        log_folder=tmp_path / "run",
        plot_every=2,
        plotting_functions=(error_plot, curve),
        tracking_tool=[MLflowLogger(tracking_uri=uri)],
    )
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
    trainer.fit(_loader())
    run_id = trainer.callback_manager.writer.run.info.run_id
    names = sorted(a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run_id))
    # train_start (epoch 0), epoch 2, train_end (epoch 2 again: the same artifact)
    assert [n for n in names if n.endswith(".png")] == [
        "curve_0.png",
        "curve_2.png",
        "error_epoch_0.png",
        "error_epoch_2.png",
    ]
