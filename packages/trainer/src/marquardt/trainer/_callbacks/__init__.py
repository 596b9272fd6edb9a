"""Callbacks: ``Callback`` bound to a ``TrainingStage``, the manager, and the built-ins."""

from ._base import Callback, CallbacksManager, TrainingStage
from ._builtin import (
    LoadCheckpoint,
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
    "LoadCheckpoint",
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
