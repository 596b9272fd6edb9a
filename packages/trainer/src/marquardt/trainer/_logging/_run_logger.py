"""``RunLogger``: rank 0's reporting for one run, with the loggers chosen once.

The tracking tools' names (``"csv"``, ``"tensorboard"``, ``"mlflow"``) become
logger instances here, once; instances are used as given. Every rank builds a
``RunLogger``, but only rank 0's is enabled: the others print and write nothing. The run
folder always gets ``hparams.json`` (the configuration and ``TrainConfig.hyperparams``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ._base import Logger
from ._console import Console
from ._csv import CSVLogger
from ._mlflow import MLflowLogger
from ._tensorboard import TensorBoardLogger

#: The loggers ``tracking_tool`` may name.
BY_NAME: dict[str, type[Any]] = {
    "csv": CSVLogger,
    "tensorboard": TensorBoardLogger,
    "mlflow": MLflowLogger,
}


def make_loggers(tools: Iterable[Any]) -> list[Logger]:
    """Loggers for ``TrainConfig.tracking``: names built with their defaults, instances kept."""
    return [BY_NAME[t]() if isinstance(t, str) else t for t in tools]


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
    ) -> None:
        self.folder = folder
        self.enabled = enabled
        self.loggers: list[Logger] = []
        self.console: Console | None = None
        if not enabled:
            return
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "hparams.json", "w") as handle:
            json.dump(dict(params), handle, indent=2, default=str)
        self.console = Console(max_iter, start_step, verbose)
        self.console.line(f"marquardt.trainer: {describe}; run folder {folder}")
        for logger in make_loggers(tools):
            logger.start(folder, start_step)
            logger.log_hyperparams(params)
            self.loggers.append(logger)

    def print_line(
        self, step: int, epoch: int, metrics: dict[str, float], phase: str = "train"
    ) -> None:
        if self.console is not None:
            self.console.step_line(step, epoch, metrics, phase)

    def progress(self, step: int, metrics: dict[str, float]) -> None:
        if self.console is not None:
            self.console.progress(step, metrics)

    def write(self, step: int, epoch: int, metrics: dict[str, float], phase: str = "train") -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step, epoch=epoch, phase=phase)

    def artifact(self, path: Path) -> None:
        for logger in self.loggers:
            logger.log_artifact(path)

    def message(self, text: str) -> None:
        if self.console is not None:
            self.console.message(text)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
        self.loggers = []
        if self.console is not None:
            self.console.close()
            self.console = None
