"""``TensorBoardLogger``: scalars ``<phase>/<metric>`` in ``<run folder>/tensorboard``.

Needs the ``tensorboard`` extra; without it the run goes on with a notice (the CSV still
holds every metric). A resumed run purges the events after the step it resumes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._base import notice


class TensorBoardLogger:
    """Scalars for TensorBoard, through ``torch.utils.tensorboard.SummaryWriter``."""

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
        directory = self.log_dir or folder / "tensorboard"
        self._writer = SummaryWriter(log_dir=str(directory), purge_step=start_step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        if self._writer is not None:
            self._writer.add_text("hyperparams", repr(dict(params)), 0)

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, epoch: int, phase: str
    ) -> None:
        if self._writer is not None:
            for key, value in metrics.items():
                self._writer.add_scalar(f"{phase}/{key}", value, step)

    def log_artifact(self, path: Path) -> None:
        """TensorBoard keeps no files of the run."""

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
