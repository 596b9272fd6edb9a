"""Callbacks: ``Callback`` bound to a ``TrainingStage``, the manager, and the built-ins."""

from ._base import CallbacksManager, TrainingStage
from ._legacy import Callback, EarlyStopping, Hooks, RunningTrainer, WallClockBudget

__all__ = [
    "Callback",
    "CallbacksManager",
    "EarlyStopping",
    "Hooks",
    "RunningTrainer",
    "TrainingStage",
    "WallClockBudget",
]
