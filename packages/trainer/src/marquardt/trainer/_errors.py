"""The trainer's exceptions.

Every message says what was asked, what was found, and how to fix it (after ``HINT:``).
Each class also derives from the built-in exception a caller would expect (``ValueError``
for bad values, ``FileNotFoundError`` for a missing checkpoint), so generic handlers work.
"""

from __future__ import annotations


class TrainerError(Exception):
    """Base class of every error raised by ``marquardt.trainer``."""


class ConfigError(TrainerError, ValueError):
    """A ``TrainConfig`` field, or a ``Trainer`` argument, is out of range or inconsistent."""


class LaunchError(TrainerError, RuntimeError):
    """The launch environment does not match the configuration (caught before any rendezvous)."""


class CheckpointError(TrainerError):
    """Base class of checkpoint errors."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint asked for does not exist."""


class CheckpointCorruptError(CheckpointError, ValueError):
    """The checkpoint file exists but cannot be read (truncated, or not a checkpoint)."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """The checkpoint was written for another model, optimizer or training loop."""


class WorkerFailedError(TrainerError, RuntimeError):
    """A training process died or raised; the whole run was stopped.

    ``rank`` is the global rank of the process that failed first (``None`` if unknown).
    """

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class EpochSemanticsWarning(UserWarning):
    """``max_iter`` and the ``*_every`` periods count epochs (they counted steps before 0.3)."""
