"""Loggers behind the ``Logger`` protocol: CSV, TensorBoard without its package, a logger of
the user's own, and MLflow against its local file store (params, metrics per epoch, the
final model as an artifact), written by the configuration's callbacks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from marquardt.trainer import (
    ConfigError,
    CSVLogger,
    Logger,
    MLflowLogger,
    TensorBoardLogger,
    TrainConfig,
    Trainer,
)
from marquardt.trainer._persistence import _files as ckpt

from ..conftest import read_csv
from ..training import make_config, make_model, sinc_loader


def _fit(tmp_path: Path, tracking: Any, max_iter: int = 4, **kw: Any) -> Trainer:
    model = make_model()
    loader = sinc_loader(batch_size=16, n=32)  # 2 steps an epoch
    config = make_config(
        tmp_path,
        max_iter=max_iter,
        val_every=2,
        checkpoint_every=2,
        tracking_tool=tracking,
        hyperparams={"width": 8},
        **kw,
    )
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
    trainer.fit(loader, loader)
    return trainer


class Memory:
    """A logger of the user's own: keeps everything in lists."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def start(self, folder: Path, start_step: int) -> None:
        self.calls.append(("start", start_step))

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        self.calls.append(("params", params.get("hyperparams", params)))

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, epoch: int, phase: str
    ) -> None:
        self.calls.append((phase, step))

    def log_artifact(self, path: Path) -> None:
        self.calls.append(("artifact", path.name))

    def close(self) -> None:
        self.calls.append(("close", None))


def test_a_logger_of_ones_own_gets_every_call_in_order(tmp_path: Path) -> None:
    memory = Memory()
    assert isinstance(memory, Logger)
    _fit(tmp_path, [memory])
    # Metrics at the global step, from epoch 1 on (epoch 0 is only the validation before
    # training, written at train_start); the end writes the last epoch again, as perceptrain.
    assert memory.calls == [
        ("start", 0),
        ("params", {"width": 8}),
        ("val", 0),
        ("train", 4), ("train", 6), ("val", 6), ("train", 8), ("train", 10), ("val", 10),
        ("params", {"width": 8}),
        ("train", 10),
        ("artifact", ckpt.checkpoint_name(10)),
        ("close", None),
    ]  # fmt: skip
    assert (tmp_path / "metrics.csv").exists()  # the CSV is always written


def test_every_tracking_tool_name_is_checked_and_built_from_one_table() -> None:
    from marquardt.trainer import ExperimentTrackingTool
    from marquardt.trainer._logging._run_logger import make_loggers

    assert ExperimentTrackingTool.names() == ("tensorboard", "mlflow", "csv")
    for tool in ExperimentTrackingTool:
        assert TrainConfig(tracking_tool=tool.value).tracking == (tool.value,)
        assert [type(g) for g in make_loggers([tool.value])][-1] is tool.logger
        assert tool == tool.value and str(tool) == tool.value
    assert [type(g) for g in make_loggers(["mlflow"])] == [CSVLogger, MLflowLogger]


def test_unknown_names_and_objects_are_refused_with_the_known_names() -> None:
    with pytest.raises(ConfigError, match=r"among tensorboard, mlflow, csv.*unknown: 'wandb'"):
        TrainConfig(tracking_tool=["csv", "wandb"])
    with pytest.raises(ConfigError, match=r"loggers \(objects with start, log_hyperparams"):
        TrainConfig(tracking_tool=[object()])


def test_csv_by_name_and_by_instance(tmp_path: Path) -> None:
    _fit(tmp_path / "a", "csv")
    _fit(tmp_path / "b", [CSVLogger(tmp_path / "elsewhere.csv")])
    for path in (tmp_path / "a" / "metrics.csv", tmp_path / "elsewhere.csv"):
        rows = read_csv(path)
        assert [(r["epoch"], r["step"], r["phase"]) for r in rows][:4] == [
            ("0", "0", "val"), ("1", "4", "train"), ("2", "6", "train"), ("2", "6", "val"),
        ]  # fmt: skip


def test_tensorboard_without_its_package_leaves_a_notice_and_trains_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    trainer = _fit(tmp_path, ["csv", TensorBoardLogger()])
    assert (trainer.global_step, trainer.current_epoch) == (10, 4)
    assert "tensorboard is not installed" in capsys.readouterr().err
    assert len(read_csv(tmp_path / "metrics.csv")) == 8  # the other loggers got everything


def test_mlflow_file_store_holds_params_metrics_per_epoch_and_the_final_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it, opt-in
    uri = (tmp_path / "mlruns").as_uri()
    logger = MLflowLogger(tracking_uri=uri, experiment="sinc", run_name="unit")
    trainer = _fit(tmp_path / "run", ["csv", logger], max_iter=4, log_model=True)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "unit"
    assert run.data.params["hyperparams.width"] == "8"
    assert run.data.params["config.max_iter"] == "4" and run.data.params["width"] == "8"
    history = client.get_metric_history(logger.run_id, "train_loss")
    csv_losses = [
        float(r["train_loss"])
        for r in read_csv(tmp_path / "run" / "metrics.csv")
        if r["phase"] == "train"
    ]
    assert sorted({m.step for m in history}) == [1, 2, 3, 4]  # epochs
    assert sorted({m.value for m in history}) == pytest.approx(sorted(set(csv_losses)))
    val_steps = [m.step for m in client.get_metric_history(logger.run_id, "val_loss")]
    assert sorted(set(val_steps)) == [0, 2, 4]
    folders = sorted(a.path for a in client.list_artifacts(logger.run_id))
    assert folders == ["checkpoints", "model"]
    (saved,) = (a.path for a in client.list_artifacts(logger.run_id, "checkpoints"))
    assert saved == f"checkpoints/{ckpt.checkpoint_name(10)}"
    local = Path(client.download_artifacts(logger.run_id, saved, str(tmp_path / "dl")))
    model = make_model()
    model.load_state_dict(ckpt.read_checkpoint(local)["model"])
    trained = trainer.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    # log_model: an MLflow model (as perceptrain logs it), loadable, with the batch's signature
    import mlflow.pytorch

    folder = client.download_artifacts(logger.run_id, "model", str(tmp_path / "dl"))
    assert (Path(folder) / "MLmodel").is_file()
    loaded = mlflow.pytorch.load_model(folder)
    x = torch.linspace(-1, 1, 5).unsqueeze(1)
    assert torch.equal(loaded(x), trainer.model(x))
    signature = mlflow.models.get_model_info(folder).signature
    assert signature is not None
    assert tuple(signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == (-1, 1)


def test_mlflow_by_name_uses_the_environment_s_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "store").as_uri()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "by-name")
    _fit(tmp_path / "run", "mlflow", max_iter=3)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("by-name")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in history] == [1, 2, 3, 3]  # and the last epoch again at the end


def test_mlflow_by_name_without_a_uri_uses_perceptrain_s_store_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # perceptrain sets MLflow's tracking URI to MLFLOW_TRACKING_URI, else to "": MLflow's
    # file store in ./mlruns, where a perceptrain user's `mlflow ui` looks.
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    trainer = _fit(tmp_path / "run", "mlflow", max_iter=2)
    assert trainer.callback_manager.writer.run is not None
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.get_run(trainer.callback_manager.writer.run.info.run_id)
    assert run.data.params["config.max_iter"] == "2"
    assert not (tmp_path / "run" / "mlruns").exists()


def test_mlflow_in_run_folder_keeps_the_store_in_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "elsewhere").as_uri())
    monkeypatch.chdir(tmp_path)
    logger = MLflowLogger(in_run_folder=True)
    _fit(tmp_path / "run", [logger], max_iter=2)
    assert logger.tracking_uri == (tmp_path / "run" / "mlruns").as_uri()
    run = MlflowClient(tracking_uri=logger.tracking_uri).get_run(logger.run_id)
    assert run.data.params["config.max_iter"] == "2"
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "mlruns").exists()


def test_mlflow_logger_refuses_two_stores() -> None:
    with pytest.raises(ConfigError, match=r"two stores.*HINT"):
        MLflowLogger(tracking_uri="file:///tmp/mlruns", in_run_folder=True)


def test_an_unreachable_mlflow_store_fails_before_the_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    logger = MLflowLogger(tracking_uri=(tmp_path / "mlruns").as_uri())
    with pytest.raises(ConfigError, match=r"MLflow: cannot open a run.*HINT"):
        _fit(tmp_path / "run", [logger])
    assert not (tmp_path / "run" / "checkpoints").exists()
