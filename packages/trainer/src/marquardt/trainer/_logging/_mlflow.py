"""``MLflowLogger``: parameters, metrics by epoch, figures, the final checkpoint and the model in an MLflow run.

Needs the ``mlflow`` extra (``mlflow-skinny``). It talks to the tracking store through an
``MlflowClient`` of its own (no global active run), so it works beside user code that uses
MLflow itself. The store is ``tracking_uri`` if given, else ``<run folder>/mlruns`` with
``in_run_folder=True``, else perceptrain's: ``MLFLOW_TRACKING_URI``, else MLflow's store for
an empty URI, a file store in ``./mlruns`` of the working directory. The experiment is
``experiment`` if given, else ``MLFLOW_EXPERIMENT_NAME``, else ``"marquardt"``. Each invocation of ``fit`` is one MLflow
run; a resumed run logs its steps from where it resumed. Recent MLflow keeps its file store
in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true`` is set.

Artifacts: the final checkpoint under ``checkpoints/``; with ``log_model`` the model as an
MLflow model under ``model/`` (``mlflow.pytorch``, pickled, with a signature inferred from
one training batch), which ``mlflow.pytorch.load_model("runs:/<run id>/model")`` loads.
"""

from __future__ import annotations

import inspect
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import torch

from .. import _disk as disk
from .. import _settings
from .._errors import ConfigError
from ._base import flatten

#: MLflow refuses parameter values longer than this.
_PARAM_LIMIT = 6000


def store_uri(folder: Path, in_run_folder: bool) -> str:
    """The tracking store when none is given: ``<folder>/mlruns`` when asked, else
    perceptrain's (``MLFLOW_TRACKING_URI``, else the empty URI's ``./mlruns``)."""
    if in_run_folder:
        return (folder / "mlruns").resolve().as_uri()
    return _settings.get("MLFLOW_TRACKING_URI") or Path("mlruns").resolve().as_uri()


class MLflowLogger:
    """An MLflow run: ``log_params`` once, ``log_batch`` of metrics per step, the final model.

    Arguments:
        tracking_uri: the tracking store; ``None``: as ``in_run_folder`` says.
        experiment: the experiment's name; ``None``: ``MLFLOW_EXPERIMENT_NAME``, else
            ``"marquardt"``.
        run_name: the MLflow run's name; ``None``: MLflow's choice.
        in_run_folder: without ``tracking_uri``: ``True`` keeps a file store in the run
            folder, ``<run folder>/mlruns``, whatever the environment says; ``False`` (the
            default) uses perceptrain's store: ``MLFLOW_TRACKING_URI``, else ``./mlruns``
            in the working directory.

    Raises:
        ConfigError: both ``tracking_uri`` and ``in_run_folder=True`` are given.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        *,
        in_run_folder: bool = False,
    ) -> None:
        if tracking_uri is not None and in_run_folder:
            raise ConfigError(
                f"MLflowLogger(tracking_uri={tracking_uri!r}, in_run_folder=True) names two "
                "stores. HINT: pass one of them"
            )
        self.tracking_uri = tracking_uri
        self.in_run_folder = in_run_folder
        self.experiment = experiment
        self.run_name = run_name
        self.run_id: str | None = None
        #: The MLflow run (``mlflow.entities.Run``) once started; kept after ``close``.
        self.run: Any = None
        self._client: Any = None

    def start(self, folder: Path, start_step: int) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError(
                "tracking_tool 'mlflow' asked for but mlflow is not installed. HINT: pip "
                "install marquardt-trainer[mlflow]"
            ) from None
        uri = self.tracking_uri or store_uri(folder, self.in_run_folder)
        name = self.experiment or _settings.get("MLFLOW_EXPERIMENT_NAME") or "marquardt"
        try:
            client = MlflowClient(tracking_uri=uri)
            found = client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found else client.create_experiment(name)
            run = client.create_run(experiment_id, run_name=self.run_name)
        except Exception as exc:
            if disk.os_error(exc) is not None:
                raise  # a file store that cannot be written: the run logger says so
            raise ConfigError(
                f"MLflow: cannot open a run in experiment {name!r} at {uri} "
                f"({type(exc).__name__}: {str(exc)[:400]}). HINT: check the tracking URI; a "
                "local file store needs MLFLOW_ALLOW_FILE_STORE=true with recent MLflow"
            ) from exc
        self._client = client
        self.tracking_uri = uri
        self.run_id = run.info.run_id
        self.run = run

    def files(self, folder: Path) -> Path:
        """Where a local store keeps the run's files (``folder`` for other stores)."""
        uri = self.tracking_uri or ""
        return Path(url2pathname(urlparse(uri).path)) if uri.startswith("file:") else folder

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        flat = flatten(params)
        entries = [Param(k, str(v)[:_PARAM_LIMIT]) for k, v in sorted(flat.items())]
        for i in range(0, len(entries), 100):  # MLflow takes at most 100 params per batch
            self._client.log_batch(self.run_id, params=entries[i : i + 100])

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, epoch: int, phase: str
    ) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        entries = [Metric(k, float(v), stamp, epoch) for k, v in metrics.items()]
        self._client.log_batch(self.run_id, metrics=entries)

    def log_figure(self, name: str, figure: Any, epoch: int) -> None:
        """A plotting function's figure at ``epoch``: the artifact ``name`` when it names a
        file (``"error_epoch_4.png"``, as perceptrain logs it), else ``<name>_<epoch>.png``."""
        artifact = name if Path(name).suffix else f"{name}_{epoch}.png"
        self._client.log_figure(self.run_id, figure, artifact)

    def log_artifact(self, path: Path) -> None:
        self._client.log_artifact(self.run_id, str(path), artifact_path="checkpoints")

    def log_model(self, model: torch.nn.Module, example: torch.Tensor | None) -> None:
        """``model`` as an MLflow model under the artifact ``model/``; its signature from
        ``model(example)`` when ``example`` (inputs of one batch) is given."""
        import mlflow.pytorch
        from mlflow.models import infer_signature

        signature = None
        if example is not None:
            with torch.no_grad():
                out = model(example)
            if isinstance(out, torch.Tensor):
                signature = infer_signature(
                    example.detach().cpu().numpy(), out.detach().cpu().numpy()
                )
        options: dict[str, Any] = {"signature": signature}
        if "serialization_format" in inspect.signature(mlflow.pytorch.save_model).parameters:
            # MLflow 3's default, "pt2", traces the model and refuses one without an
            # example input; pickling takes any module, as perceptrain's MLflow did.
            options["serialization_format"] = "pickle"
        with tempfile.TemporaryDirectory(prefix="marquardt-mlflow-") as tmp:
            local = Path(tmp) / "model"
            mlflow.pytorch.save_model(model, str(local), **options)
            self._client.log_artifacts(self.run_id, str(local), artifact_path="model")

    def close(self) -> None:
        if self._client is not None and self.run_id is not None:
            self._client.set_terminated(self.run_id)
            self._client = None
