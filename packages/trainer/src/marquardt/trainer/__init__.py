"""marquardt.trainer: ``TrainConfig`` and ``Trainer``, a DDP loop and an LM loop.

The same script runs under ``python`` (one process, or ``nprocs`` spawned ones),
``torchrun``, Slurm's ``srun`` (one task per process, or one task per node that spawns
its processes) and ``legate`` (the LM loop)::

    from marquardt.trainer import TrainConfig, Trainer
    from marquardt.trainer.optimize_step import optimize_step

    config = TrainConfig(backend="gloo", nprocs=2, compute_setup="cpu", max_iter=50)
    model, optimizer = Trainer(model, optimizer, config, loss_fn="mse").fit(loader)
"""

from ._callbacks import Callback, EarlyStopping, WallClockBudget
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
from ._state import TrainerState
from ._trainer import Trainer

__all__ = [
    "CSVLogger",
    "Callback",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "ConfigError",
    "EarlyStopping",
    "LaunchEnvironment",
    "LaunchError",
    "LegateEnvironment",
    "Logger",
    "MLflowLogger",
    "NonFiniteLossError",
    "PlainEnvironment",
    "ProcessLayout",
    "RunFilesError",
    "SlurmTaskPerNode",
    "SlurmTaskPerProcess",
    "SpawnEnvironment",
    "TensorBoardLogger",
    "TorchrunEnvironment",
    "TrainConfig",
    "Trainer",
    "TrainerError",
    "TrainerState",
    "WallClockBudget",
    "WorkerFailedError",
    "detect_environment",
]
