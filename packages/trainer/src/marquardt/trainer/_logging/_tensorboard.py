"""``TensorBoardLogger``: scalars ``train_loss``, ``val_loss``, ... by epoch in ``<run folder>/tensorboard``.

Needs the ``tensorboard`` extra; without it the run goes on with a notice (the CSV still
holds every metric). A resumed run appends its epochs to the events already there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._base import notice


class TensorBoardLogger:
    """Scalars for TensorBoard, through ``torch.utils.tensorboard.SummaryWriter``.

    Without tensorboard installed, ``start`` says so on stderr and the logger writes
    nothing.

    Arguments:
        log_dir: the folder of the event files; ``None``: ``tensorboard/`` in the run
            folder.
    """

    def __init__(self, log_dir: str | Path | None = None) -> None:
        self.log_dir = None if log_dir is None else Path(log_dir)
        self._writer: Any = None

    def start(self, folder: Path, start_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            notice(
                "tracking_tool 'tensorboard' asked for but tensorboard is not installed; "
                "metrics go to the other loggers only (pip install marquardt-trainer[tensorboard])"
            )
            return
        self._writer = SummaryWriter(log_dir=str(self.files(folder)))

    def files(self, folder: Path) -> Path:
        """The folder of its event files."""
        return self.log_dir or folder / "tensorboard"

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        if self._writer is not None:
            self._writer.add_text("hyperparams", repr(dict(params)), 0)

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, epoch: int, phase: str
    ) -> None:
        if self._writer is not None:
            for key, value in metrics.items():
                self._writer.add_scalar(key, value, epoch)

    def log_figure(self, name: str, figure: Any, epoch: int) -> None:
        """A plotting function's figure at ``epoch``."""
        if self._writer is not None:
            self._writer.add_figure(name, figure, global_step=epoch)

    def log_artifact(self, path: Path) -> None:
        """TensorBoard keeps no files of the run."""

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
