"""Callbacks: ``Callback`` bound to a ``TrainingStage``, the manager, and the built-ins.

Nothing here imports the trainer's other folders (the loops and persistence import this
package); ``LoadCheckpoint`` lives with the checkpoint helpers it calls.
"""

from ._base import Callback, CallbacksManager, TrainingStage
from ._builtin import (
    LogHyperparameters,
    LogModelTracker,
    PlotMetrics,
    PrintMetrics,
    SaveBestCheckpoint,
    SaveCheckpoint,
    WriteMetrics,
    WritePlots,
    config_callbacks,
)
from ._legacy import EarlyStopping, WallClockBudget

__all__ = [
    "Callback",
    "CallbacksManager",
    "EarlyStopping",
    "LogHyperparameters",
    "LogModelTracker",
    "PlotMetrics",
    "PrintMetrics",
    "SaveBestCheckpoint",
    "SaveCheckpoint",
    "TrainingStage",
    "WallClockBudget",
    "WriteMetrics",
    "WritePlots",
    "config_callbacks",
]
