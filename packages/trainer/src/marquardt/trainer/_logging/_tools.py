"""``ExperimentTrackingTool``: the one table of tracking tools, each name with its logger.

perceptrain's enum names TensorBoard and MLflow; ours adds CSV. Each member is its name (a
``str``: ``ExperimentTrackingTool.MLFLOW == "mlflow"``) and carries ``logger``, the
``Logger`` class that name builds with its defaults. ``TrainConfig`` checks the names of
``tracking_tool`` against this table and the run logger builds its loggers from it: a new
tracking tool is one line here.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from ._csv import CSVLogger
from ._mlflow import MLflowLogger
from ._tensorboard import TensorBoardLogger


class ExperimentTrackingTool(str, Enum):
    """The experiment trackers ``TrainConfig.tracking_tool`` names (perceptrain's, and CSV).

    Each member is its name and carries ``logger``, the logger class the name builds.
    """

    #: The logger class this tracking tool's name builds (with its defaults).
    logger: type[Any]

    def __new__(cls, name: str, logger: type[Any]) -> ExperimentTrackingTool:
        member = str.__new__(cls, name)
        member._value_ = name
        member.logger = logger
        return member

    TENSORBOARD = "tensorboard", TensorBoardLogger
    MLFLOW = "mlflow", MLflowLogger
    CSV = "csv", CSVLogger

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every tracking tool's name, in the table's order."""
        return tuple(str(member.value) for member in cls)

    @classmethod
    def logger_named(cls, name: str) -> type[Any]:
        """The logger class the tracking tool ``name`` builds (``KeyError`` if none)."""
        for member in cls:
            if member.value == name:
                return member.logger
        raise KeyError(name)
