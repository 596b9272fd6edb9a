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
from ._lr_callbacks import (
    LRSchedulerCosineAnnealing,
    LRSchedulerCyclic,
    LRSchedulerReduceOnPlateau,
    LRSchedulerStepDecay,
)
from ._monitoring import GradientMonitoring
from ._sampling import R3Sampling
from ._stopping import EarlyStopping, WallClockBudget

__all__ = [
    "Callback",
    "CallbacksManager",
    "EarlyStopping",
    "GradientMonitoring",
    "LRSchedulerCosineAnnealing",
    "LRSchedulerCyclic",
    "LRSchedulerReduceOnPlateau",
    "LRSchedulerStepDecay",
    "LogHyperparameters",
    "LogModelTracker",
    "PlotMetrics",
    "PrintMetrics",
    "R3Sampling",
    "SaveBestCheckpoint",
    "SaveCheckpoint",
    "TrainingStage",
    "WallClockBudget",
    "WriteMetrics",
    "WritePlots",
    "config_callbacks",
]
