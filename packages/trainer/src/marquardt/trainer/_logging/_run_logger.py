"""``RunLogger``: rank 0's reporting for one run, with the loggers chosen once.

It is the ``writer`` callbacks receive (and ``trainer.callback_manager.writer``), with
perceptrain's writer methods: ``write`` (metrics of an epoch), ``print_metrics``,
``log_hyperparams``, ``plot`` (plotting functions' figures) and ``log_model``, translated
here to our loggers, and ``run``, the MLflow run (``mlflow.entities.Run``) when MLflow is
one of the tracking tools, kept after the run ends. The tracking
tools' names (``"tensorboard"``, ``"mlflow"``, ``"csv"``) become logger instances here,
once, through ``ExperimentTrackingTool``'s table; instances are used as given; ``metrics.csv`` is always written. Every rank builds a
``RunLogger``, but only rank 0's is enabled: the others print and write nothing. The run
folder always gets ``hparams.json`` (the configuration and ``TrainConfig.hyperparams``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from .. import _disk as disk
from .._state import TrainerState
from ._base import Logger
from ._console import Console
from ._csv import CSVLogger
from ._tools import ExperimentTrackingTool

#: The run's configuration and ``TrainConfig.hyperparams``, in the run folder.
HPARAMS = "hparams.json"


def make_loggers(tools: Iterable[Any]) -> list[Logger]:
    """Loggers for ``TrainConfig.tracking``: names built by ``ExperimentTrackingTool``'s
    table with their defaults, instances kept, and a ``CSVLogger`` when there is none."""
    named = ExperimentTrackingTool.logger_named
    loggers = [named(t)() if isinstance(t, str) else t for t in tools]
    if not any(isinstance(logger, CSVLogger) for logger in loggers):
        loggers.insert(0, CSVLogger())
    return loggers


def phase_of(metrics: Mapping[str, Any]) -> str:
    """``"val"`` or ``"test"`` when every metric name says so, else ``"train"``."""
    for phase in ("val", "test"):
        if metrics and all(str(k).startswith(f"{phase}_") for k in metrics):
            return phase
    return "train"


def _number(value: Any) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


class RunLogger:
    """Rank 0's console and loggers for one run folder (does nothing on other ranks)."""

    def __init__(
        self,
        folder: Path,
        enabled: bool,
        start_step: int,
        describe: str,
        *,
        max_iter: int,
        verbose: bool,
        params: Mapping[str, Any],
        tools: Iterable[Any],
        state: TrainerState | None = None,
    ) -> None:
        self.folder = folder
        self.enabled = enabled
        self.state = state
        self.loggers: list[Logger] = []
        self.console: Console | None = None
        #: The MLflow run of this run (perceptrain's ``writer.run``); None without MLflow.
        self.run: Any = None
        if not enabled:
            return
        text = json.dumps(dict(params), indent=2, default=str)
        with self._writing("file", folder / HPARAMS):
            disk.replace_atomically(folder / HPARAMS, lambda tmp: tmp.write_text(text))
        start_epoch = state.epoch if state is not None else 0
        self.console = Console(max_iter + 1, start_epoch, verbose)
        self.console.line(f"marquardt.trainer: {describe}; run folder {folder}")
        for logger in make_loggers(tools):
            self.loggers.append(logger)
            with self._writing_for(logger):
                logger.start(folder, start_step)
                logger.log_hyperparams(params)
            if self.run is None:
                self.run = getattr(logger, "run", None)

    # perceptrain's writer methods (rank 0 does the work; other ranks' writers are idle)
    def write(self, iteration: int, metrics: Mapping[str, Any]) -> None:
        """The metrics of epoch ``iteration`` to every logger (at the current global step)."""
        if not self.enabled:
            return
        plain = {str(k): _number(v) for k, v in metrics.items() if _is_number(v)}
        if not plain:  # e.g. train_start of a resumed run: nothing measured yet
            return
        step = self.state.step if self.state is not None else iteration
        phase = phase_of(plain)
        for logger in self.loggers:
            with self._writing_for(logger):
                logger.log_metrics(plain, step, epoch=iteration, phase=phase)

    def print_metrics(self, result: Any) -> None:
        """One line in perceptrain's format: rank, device, epoch, the loss, other metrics."""
        if self.console is None:
            return
        metrics = result.metrics
        loss_key = next((k for k in metrics if "loss" in k.lower()), None)
        line = f"P {result.rank: >2}|{result.device!s: <7}| Iteration {result.iteration: >7}| "
        if loss_key is not None:
            line += f"{loss_key.title()}: {_number(metrics[loss_key]):.7f} -"
        else:
            line += "Loss: None -"
        line += " ".join(f"{k}: {_number(v):.7f}" for k, v in metrics.items() if k != loss_key)
        self.console.line(line)

    def log_hyperparams(self, hyperparams: Mapping[str, Any]) -> None:
        """``hyperparams`` to every logger (they also went to ``hparams.json`` at the start)."""
        for logger in self.loggers:
            with self._writing_for(logger):
                logger.log_hyperparams(dict(hyperparams))

    def plot(self, model: Any, iteration: int, plotting_functions: Iterable[Any]) -> None:
        """Each ``fn(model, iteration) -> (name, figure)`` to the loggers that take figures,
        or as ``plots/<name>_<iteration>.png`` in the run folder when none does."""
        if not self.enabled:
            return
        takers = [g for g in self.loggers if callable(getattr(g, "log_figure", None))]
        for fn in plotting_functions:
            name, figure = fn(model, iteration)
            for logger in takers:
                logger.log_figure(str(name), figure, iteration)  # type: ignore[attr-defined]
            if not takers:
                (self.folder / "plots").mkdir(parents=True, exist_ok=True)
                figure.savefig(self.folder / "plots" / f"{name}_{iteration}.png")
            _close(figure)

    def log_model(self, model: Any, *dataloaders: Any) -> None:
        """The model's weights as ``model.pt`` in the run folder; the model itself to the
        loggers that take models (MLflow: an MLflow model, its signature from the first
        data loader's first batch), ``model.pt`` to the others."""
        if not self.enabled:
            return
        path = self.folder / "model.pt"
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        with self._writing("file", path):
            disk.replace_atomically(path, lambda tmp: torch.save(weights, str(tmp)))
        takers = [g for g in self.loggers if callable(getattr(g, "log_model", None))]
        example = _example_inputs(model, dataloaders[0]) if takers and dataloaders else None
        for logger in self.loggers:
            with self._writing_for(logger):
                if logger in takers:
                    logger.log_model(model, example)  # type: ignore[attr-defined]
                else:
                    logger.log_artifact(path)

    def print_line(self, text: str) -> None:
        if self.console is not None:
            self.console.line(text)

    def progress(self, epoch: int, metrics: dict[str, float]) -> None:
        if self.console is not None:
            self.console.progress(epoch, metrics)

    def artifact(self, path: Path) -> None:
        for logger in self.loggers:
            with self._writing_for(logger):
                logger.log_artifact(path)

    def message(self, text: str) -> None:
        if self.console is not None:
            self.console.message(text)

    def close(self) -> None:
        """Close every logger, also after one fails; a failure is raised at the end,
        unless the run is already ending with an error (which it must not hide)."""
        failed: BaseException | None = None
        for logger in self.loggers:
            try:
                with self._writing_for(logger):
                    logger.close()
            except Exception as exc:
                failed = failed or exc
        self.loggers = []
        if self.console is not None:
            self.console.close()
            self.console = None
        if failed is not None and sys.exc_info()[1] is None:
            raise failed

    def _writing_for(self, logger: Any) -> AbstractContextManager[None]:
        """A logger's call: the file system's refusal becomes a `RunFilesError`."""
        files = getattr(logger, "files", None)
        path = files(self.folder) if callable(files) else self.folder
        return self._writing(f"{type(logger).__name__} output", path)

    def _writing(self, what: str, path: Path) -> AbstractContextManager[None]:
        return disk.writing(what, path, last_checkpoint=self._newest_checkpoint)

    def _newest_checkpoint(self) -> Path | None:
        return disk.newest_checkpoint(self.folder)


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, int | float) and not isinstance(value, bool)


def _close(figure: Any) -> None:
    """Close a matplotlib figure so figures do not pile up over a run."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return
    plt.close(figure)


def _example_inputs(model: Any, loader: Any) -> torch.Tensor | None:
    """The inputs of ``loader``'s first batch on the model's device (None when the batch is
    not ``(inputs, ...)`` with a tensor first), drawn without moving torch's generator."""
    if loader is None:
        return None
    try:
        with torch.random.fork_rng(devices=[]):
            batch = next(iter(loader))
    except Exception:
        return None
    inputs = batch[0] if isinstance(batch, (list, tuple)) and batch else None
    if not isinstance(inputs, torch.Tensor):
        return None
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return inputs.to(first.device) if first is not None else inputs
