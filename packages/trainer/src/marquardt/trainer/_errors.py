"""The trainer's exceptions.

Every message says what was asked, what was found, and how to fix it (after ``HINT:``).
Each class also derives from the built-in exception a caller would expect (``ValueError``
for bad values, ``FileNotFoundError`` for a missing checkpoint), so generic handlers work.
"""

from __future__ import annotations

from typing import Any


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


class _FieldsError(TrainerError):
    """An error whose keyword fields cross a process boundary whole: pickled (a worker's
    error sent to its parent) and rebuilt with the same message and fields."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self._fields = fields
        for name, value in fields.items():
            setattr(self, name, value)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (type(self), str(self), dict(self._fields))


class RunFilesError(_FieldsError, OSError):
    """A file of the run (checkpoint, metrics, logger output) could not be written.

    ``path``: the file; ``needed`` and ``free``: the bytes it needed (``None`` if unknown)
    and the bytes free on its file system; ``last_checkpoint``: the newest checkpoint left
    whole on disk (``None`` if there is none). ``errno`` is the file system's.
    """

    path: str
    needed: int | None
    free: int | None
    last_checkpoint: str | None

    def __init__(
        self,
        message: str,
        *,
        errno: int | None,
        path: str,
        needed: int | None,
        free: int | None,
        last_checkpoint: str | None,
    ) -> None:
        super().__init__(
            message,
            errno=errno,
            path=path,
            needed=needed,
            free=free,
            last_checkpoint=last_checkpoint,
        )
        self.filename = path


class CheckpointWriteError(RunFilesError, CheckpointError):
    """A checkpoint could not be written; the checkpoints already on disk are intact."""


class NonFiniteLossError(_FieldsError, FloatingPointError):
    """The training loss, or the parameters after a step, are NaN or infinite.

    ``step``, ``epoch`` and ``batch`` (the batch's index in its epoch) say where;
    ``last_checkpoint`` is the newest finite checkpoint (``None`` if there is none).
    """

    step: int
    epoch: int
    batch: int
    last_checkpoint: str | None

    def __init__(
        self,
        message: str,
        *,
        step: int,
        epoch: int,
        batch: int,
        last_checkpoint: str | None,
    ) -> None:
        super().__init__(
            message, step=step, epoch=epoch, batch=batch, last_checkpoint=last_checkpoint
        )


def _rebuild(cls: type[Exception], message: str, fields: dict[str, Any]) -> Exception:
    return cls(message, **fields)
