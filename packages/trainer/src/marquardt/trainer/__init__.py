"""marquardt.trainer: perceptrain 0.1.0's ``TrainConfig`` and ``Trainer``, a DDP loop and an LM loop.

perceptrain's API and meanings (``max_iter`` and the ``*_every`` periods count epochs;
``Callback(on=..., called_every=...)``; ``loss_fn(batch, model) -> (loss, metrics)``).
The same script runs under ``python`` (one process, or ``nprocs`` spawned ones),
``torchrun``, Slurm's ``srun`` (one task per process, or one task per node that spawns
its processes) and ``legate`` (the LM loop)::

    from marquardt.trainer import TrainConfig, Trainer
    from marquardt.trainer.optimize_step import optimize_step

    config = TrainConfig(backend="gloo", nprocs=2, compute_setup="cpu", max_iter=50)
    model, optimizer = Trainer(model, optimizer, config, loss_fn="mse").fit(loader)

Unlike perceptrain, importing this package does not change torch's default dtype.
"""

from ._callbacks import (
    Callback,
    CallbacksManager,
    EarlyStopping,
    GradientMonitoring,
    LogHyperparameters,
    LogModelTracker,
    LRSchedulerCosineAnnealing,
    LRSchedulerCyclic,
    LRSchedulerReduceOnPlateau,
    LRSchedulerStepDecay,
    PlotMetrics,
    PrintMetrics,
    R3Sampling,
    SaveBestCheckpoint,
    SaveCheckpoint,
    TrainingStage,
    WallClockBudget,
    WriteMetrics,
    WritePlots,
)
from ._config import TrainConfig
from ._environments import (
    LaunchEnvironment,
    LegateEnvironment,
    PlainEnvironment,
    ProcessLayout,
    SlurmTaskPerNode,
    SlurmTaskPerProcess,
    SpawnEnvironment,
    TorchrunEnvironment,
    detect_environment,
)
from ._errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointWriteError,
    ConfigError,
    LaunchError,
    NonFiniteLossError,
    RunFilesError,
    TrainerError,
    WorkerFailedError,
)
from ._logging._base import Logger
from ._logging._csv import CSVLogger
from ._logging._mlflow import MLflowLogger
from ._logging._tensorboard import TensorBoardLogger
from ._logging._tools import ExperimentTrackingTool
from ._parameters import get_parameters, num_parameters, set_parameters
from ._persistence._helpers import LoadCheckpoint, load_checkpoint, load_model, write_checkpoint
from ._result import OptimizeResult
from ._state import TrainerState
from ._trainer import Trainer
from .data import DictDataLoader, InfiniteTensorDataset, to_dataloader

__all__ = [
    "CSVLogger",
    "Callback",
    "CallbacksManager",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "ConfigError",
    "DictDataLoader",
    "EarlyStopping",
    "ExperimentTrackingTool",
    "GradientMonitoring",
    "InfiniteTensorDataset",
    "LRSchedulerCosineAnnealing",
    "LRSchedulerCyclic",
    "LRSchedulerReduceOnPlateau",
    "LRSchedulerStepDecay",
    "LaunchEnvironment",
    "LaunchError",
    "LegateEnvironment",
    "LoadCheckpoint",
    "LogHyperparameters",
    "LogModelTracker",
    "Logger",
    "MLflowLogger",
    "NonFiniteLossError",
    "OptimizeResult",
    "PlainEnvironment",
    "PlotMetrics",
    "PrintMetrics",
    "ProcessLayout",
    "R3Sampling",
    "RunFilesError",
    "SaveBestCheckpoint",
    "SaveCheckpoint",
    "SlurmTaskPerNode",
    "SlurmTaskPerProcess",
    "SpawnEnvironment",
    "TensorBoardLogger",
    "TorchrunEnvironment",
    "TrainConfig",
    "Trainer",
    "TrainerError",
    "TrainerState",
    "TrainingStage",
    "WallClockBudget",
    "WorkerFailedError",
    "WriteMetrics",
    "WritePlots",
    "detect_environment",
    "get_parameters",
    "load_checkpoint",
    "load_model",
    "num_parameters",
    "set_parameters",
    "to_dataloader",
    "write_checkpoint",
]
