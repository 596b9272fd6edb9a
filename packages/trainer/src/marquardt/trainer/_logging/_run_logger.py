"""``RunLogger``: rank 0's reporting for one run, with the loggers chosen once.

The tracking tools' names (``"csv"``, ``"tensorboard"``, ``"mlflow"``) become
logger instances here, once; instances are used as given. Every rank builds a
``RunLogger``, but only rank 0's is enabled: the others print and write nothing. The run
folder always gets ``hparams.json`` (the configuration and ``TrainConfig.hyperparams``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from .._persistence import _disk as disk
from .._persistence import _files as ckpt
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


#: The run's configuration and ``TrainConfig.hyperparams``, in the run folder.
HPARAMS = "hparams.json"


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # never in place of the error being raised
            tmp.unlink(missing_ok=True)
        raise


def _files_of(logger: Any, folder: Path) -> Path:
    """Where ``logger`` writes (its file or folder; the run folder for other loggers)."""
    if isinstance(logger, CSVLogger):
        return logger.path
    if isinstance(logger, TensorBoardLogger):
        return logger.log_dir or folder / "tensorboard"
    if isinstance(logger, MLflowLogger):
        uri = logger.tracking_uri or ""
        return Path(uri[len("file://") :]) if uri.startswith("file://") else folder / "mlruns"
    return folder


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
        text = json.dumps(dict(params), indent=2, default=str)
        with self._writing("file", folder / HPARAMS):
            _write_atomically(folder / HPARAMS, text)
        self.console = Console(max_iter, start_step, verbose)
        self.console.line(f"marquardt.trainer: {describe}; run folder {folder}")
        for logger in make_loggers(tools):
            self.loggers.append(logger)
            with self._writing_for(logger):
                logger.start(folder, start_step)
                logger.log_hyperparams(params)

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
            with self._writing_for(logger):
                logger.log_metrics(metrics, step, epoch=epoch, phase=phase)

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
        return self._writing(f"{type(logger).__name__} output", _files_of(logger, self.folder))

    def _writing(self, what: str, path: Path) -> AbstractContextManager[None]:
        return disk.writing(what, path, last_checkpoint=self._newest_checkpoint)

    def _newest_checkpoint(self) -> Path | None:
        return ckpt.newest_checkpoint(self.folder)
