"""``TrainConfig``: every knob of a training run, checked when the object is built.

The checks here need nothing but the values themselves (no GPU, no launcher): a value out
of range, an unknown backend, or a contradiction between two fields (``backend="nccl"``
with ``compute_setup="cpu"``) fails at construction. Checks that need the machine (is
there a GPU? how many tasks did srun start?) are made by the launch environments when the
``Trainer`` is built, still before any work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ._callbacks import Callback
from ._errors import ConfigError
from ._logging._base import Logger, is_logger

COMPUTE_SETUPS = ("cpu", "gpu", "auto")
BACKENDS = ("auto", "nccl", "gloo", "mpi")
TRACKING_TOOLS = ("csv", "tensorboard", "mlflow")
SCHEDULER_INTERVALS = ("epoch", "step")
#: What a non-finite loss or model does (``marquardt.trainer._loops._nonfinite``).
NONFINITE_POLICIES = ("stop", "skip", "continue")
_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def _fail(name: str, value: Any, need: str, hint: str) -> ConfigError:
    return ConfigError(f"TrainConfig({name}={value!r}): {need}. HINT: {hint}")


def _check_int(name: str, value: Any, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        need = f"{name} must be a whole number >= {minimum}"
        raise _fail(name, value, need, hint)


def _check_positive(name: str, value: Any, need: str, hint: str) -> None:
    """A finite real number > 0 (``True`` is not a number here)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise _fail(name, value, need, hint)


@dataclass
class TrainConfig:
    """How to train: loop length, logging, checkpoints, processes, devices.

    Counting: ``max_iter`` is the number of optimizer steps (LM steps in the LM loop);
    the loader is cycled over as many epochs as that takes. With
    ``accumulate_grad_batches = a`` one step consumes ``a`` batches per process. In a
    data-parallel run every process takes ``batch_size`` samples of the loader per batch,
    so the global batch is ``batch_size × world_size``.

    Periods (``print_every``, ``write_every``, ``checkpoint_every``, ``val_every``) are in
    steps; 0 turns the action off (a final checkpoint is still written at the end of
    ``fit``, and on SIGTERM).

    Folders: the run folder is ``log_folder`` if given, else ``root_folder`` (plus a
    time-stamped subfolder per run when ``create_subfolder_per_run``). It holds
    ``metrics.csv``, ``hparams.json``, TensorBoard events and ``checkpoints/``.

    ``checkpoint_best_only``: write ``checkpoints/best.pt`` at each new lowest validation
    loss and no numbered checkpoint, except when a stop must leave one (SIGTERM, a
    ``WallClockBudget``), so that the run can be resumed.

    LR scheduler (``Trainer(..., scheduler=...)``): stepped after every epoch
    (``scheduler_interval="epoch"``) or every optimizer step (``"step"``);
    ``ReduceLROnPlateau`` is stepped after each validation with the validation metric
    ``scheduler_monitor``.

    ``on_nonfinite``: what a NaN or infinite training loss, or parameters that are not
    finite after a step, do: ``"stop"`` the run with ``NonFiniteLossError`` (naming the
    step, the epoch, the batch and the last checkpoint), ``"skip"`` the batch (the step is
    undone and taken on the next batch), or ``"continue"``. A checkpoint is never written
    from a non-finite model, so the checkpoints kept are finite.

    ``resume_from``: ``None`` starts afresh (except in a Slurm job that was requeued, where
    it means ``"latest"``), ``"latest"`` resumes from the newest checkpoint under the run
    folder (or under ``root_folder``'s run subfolders) and starts afresh if there is none,
    a path resumes from that file and fails if it is missing.

    Processes: ``nprocs`` is the total number of training processes (the world size).
    Without a launcher, ``nprocs > 1`` spawns them; under torchrun the launcher's
    ``WORLD_SIZE`` rules (``nprocs`` may stay 1); under srun, ``nprocs`` must equal the
    number of tasks (one task per process) or a multiple of it (each task spawns
    ``nprocs / tasks`` processes). ``compute_setup="auto"`` uses GPUs when there are
    some; ``backend="auto"`` picks nccl on GPUs and gloo on CPUs, and ``backend="nccl"``
    with ``compute_setup="auto"`` on a machine without GPUs falls back to gloo on CPUs with
    a notice. ``dist_timeout`` bounds how long a collective waits for a dead peer.
    """

    max_iter: int = 10_000
    print_every: int = 100
    write_every: int = 50
    checkpoint_every: int = 0
    val_every: int = 0
    root_folder: str | Path = "marquardt_runs"
    log_folder: str | Path | None = None
    create_subfolder_per_run: bool = False
    resume_from: str | Path | None = None
    callbacks: list[Callback] = field(default_factory=list)
    tracking_tool: str | Logger | Sequence[str | Logger] | None = "csv"
    hyperparams: dict[str, Any] = field(default_factory=dict)
    nprocs: int = 1
    compute_setup: str = "auto"
    backend: str = "auto"
    dtype: torch.dtype | str | None = None
    seed: int | None = None
    all_reduce_metrics: bool = False
    grad_clip: float | None = None
    accumulate_grad_batches: int = 1
    verbose: bool = True
    keep_checkpoints: int = 3
    on_nonfinite: str = "stop"
    dist_timeout: float = 300.0
    slice_size: int | None = None
    checkpoint_best_only: bool = False
    scheduler_interval: str = "epoch"
    scheduler_monitor: str = "val_loss"

    def __post_init__(self) -> None:
        _check_int("max_iter", self.max_iter, 1, "give the number of optimizer steps, e.g. 1000")
        for name in ("print_every", "write_every", "checkpoint_every", "val_every"):
            _check_int(name, getattr(self, name), 0, f"use 0 to turn {name} off")
        _check_int("nprocs", self.nprocs, 1, "use 1 for a single process, or the world size")
        _check_int(
            "accumulate_grad_batches",
            self.accumulate_grad_batches,
            1,
            "use 1 to step the optimizer after every batch",
        )
        _check_int("keep_checkpoints", self.keep_checkpoints, 1, "keep at least the newest one")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise _fail(
                "on_nonfinite",
                self.on_nonfinite,
                f"on_nonfinite must be one of {', '.join(map(repr, NONFINITE_POLICIES))}",
                "'stop' ends the run with an error, 'skip' undoes the step and skips the "
                "batch, 'continue' goes on",
            )
        if self.seed is not None:
            _check_int("seed", self.seed, 0, "use a non-negative integer, or None")
        if self.slice_size is not None:
            _check_int("slice_size", self.slice_size, 1, "use None for the whole batch")
        if not isinstance(self.compute_setup, str) or self.compute_setup not in COMPUTE_SETUPS:
            raise _fail(
                "compute_setup",
                self.compute_setup,
                f"compute_setup must be one of {', '.join(COMPUTE_SETUPS)}",
                "'auto' uses GPUs when there are some and the CPU otherwise",
            )
        if not isinstance(self.backend, str) or self.backend not in BACKENDS:
            raise _fail(
                "backend",
                self.backend,
                f"backend must be one of {', '.join(BACKENDS)}",
                "use 'nccl' on GPUs, 'gloo' on CPUs, or 'auto' to choose by compute_setup",
            )
        if self.backend == "nccl" and self.compute_setup == "cpu":
            raise ConfigError(
                "TrainConfig(backend='nccl', compute_setup='cpu'): NCCL only moves CUDA tensors, "
                "so it cannot train on the CPU. HINT: use backend='gloo' on CPUs, or "
                "compute_setup='gpu' (or 'auto') on a machine with GPUs"
            )
        self.dtype = self._checked_dtype(self.dtype)
        self._check_tracking()
        if self.scheduler_interval not in SCHEDULER_INTERVALS:
            raise _fail(
                "scheduler_interval",
                self.scheduler_interval,
                "scheduler_interval must be 'epoch' or 'step'",
                "'epoch' steps the LR scheduler after each epoch, 'step' after each optimizer step",
            )
        if not isinstance(self.scheduler_monitor, str) or not self.scheduler_monitor:
            raise _fail(
                "scheduler_monitor",
                self.scheduler_monitor,
                "scheduler_monitor must name a validation metric",
                "e.g. scheduler_monitor='val_loss' (what ReduceLROnPlateau watches)",
            )
        for name in (
            "create_subfolder_per_run",
            "all_reduce_metrics",
            "verbose",
            "checkpoint_best_only",
        ):
            if not isinstance(getattr(self, name), bool):
                raise _fail(
                    name, getattr(self, name), f"{name} must be True or False", f"e.g. {name}=True"
                )
        if self.grad_clip is not None:
            _check_positive(
                "grad_clip",
                self.grad_clip,
                "grad_clip must be a finite number > 0 (the largest gradient norm)",
                "use None to leave gradients unclipped, e.g. grad_clip=1.0",
            )
        _check_positive(
            "dist_timeout",
            self.dist_timeout,
            "dist_timeout must be a positive number of seconds",
            "e.g. dist_timeout=300; a dead peer is detected within this time",
        )
        self._check_paths()
        if not isinstance(self.callbacks, list | tuple) or not all(
            isinstance(c, Callback) for c in self.callbacks
        ):
            raise _fail(
                "callbacks",
                self.callbacks,
                "callbacks must be a list of marquardt.trainer.Callback instances",
                "subclass Callback and pass instances, e.g. callbacks=[EarlyStopping()]",
            )
        self.callbacks = list(self.callbacks)
        if not isinstance(self.hyperparams, dict) or not all(
            isinstance(k, str) for k in self.hyperparams
        ):
            raise _fail(
                "hyperparams",
                self.hyperparams,
                "hyperparams must be a dict with string keys",
                "e.g. hyperparams={'lr': 0.01}",
            )

    @staticmethod
    def _checked_dtype(dtype: Any) -> torch.dtype | None:
        if dtype is None:
            return None
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise _fail(
                    "dtype",
                    dtype,
                    f"a dtype name must be one of {', '.join(_DTYPES)}",
                    "e.g. dtype=torch.float64 or dtype='float64'",
                )
            return _DTYPES[dtype]
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise _fail(
                "dtype",
                dtype,
                "dtype must be a floating-point torch.dtype or None",
                "e.g. dtype=torch.float64; None keeps the model's own dtype",
            )
        return dtype

    def _check_tracking(self) -> None:
        unknown = [t for t in self.tracking if isinstance(t, str) and t not in TRACKING_TOOLS]
        unknown += [repr(t) for t in self.tracking if not isinstance(t, str) and not is_logger(t)]
        if unknown:
            raise _fail(
                "tracking_tool",
                self.tracking_tool,
                f"tracking tools must be among {', '.join(TRACKING_TOOLS)}, or loggers "
                f"(objects with start, log_hyperparams, log_metrics, log_artifact and close); "
                f"unknown: {', '.join(map(repr, unknown))}",
                "e.g. tracking_tool='csv' or tracking_tool=['csv', MLflowLogger()]",
            )

    def _check_paths(self) -> None:
        for name in ("root_folder", "log_folder"):
            value = getattr(self, name)
            if value is None and name == "log_folder":
                continue
            if not isinstance(value, str | Path) or str(value) == "":
                raise _fail(name, value, f"{name} must be a non-empty path", "e.g. 'runs'")
        resume = self.resume_from
        if resume is not None and (not isinstance(resume, str | Path) or str(resume) == ""):
            raise _fail(
                "resume_from",
                resume,
                "resume_from must be None, 'latest' or a checkpoint path",
                "use resume_from='latest' to continue the newest checkpoint",
            )

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """``dtype`` as a ``torch.dtype`` (a name given at construction is resolved there)."""
        return self.dtype if isinstance(self.dtype, torch.dtype) else None

    @property
    def tracking(self) -> tuple[Any, ...]:
        """The tracking tools as a tuple: names (lower case) and logger instances."""
        tool = self.tracking_tool
        if tool is None:
            return ()
        if isinstance(tool, str) or not isinstance(tool, Sequence):
            tool = [tool]
        return tuple(t.lower() if isinstance(t, str) else t for t in tool)

    @property
    def trackers(self) -> tuple[str, ...]:
        """The tracking tools by name (a logger instance by its class name)."""
        return tuple(t if isinstance(t, str) else type(t).__name__ for t in self.tracking)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain values (stored in checkpoints and hparams.json)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "callbacks":
                value = [type(c).__name__ for c in value]
            elif f.name == "tracking_tool":
                value = list(self.trackers)
            elif isinstance(value, Path | torch.dtype):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out
