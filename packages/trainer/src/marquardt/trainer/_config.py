"""``TrainConfig``: every knob of a training run, checked when the object is built.

The checks here need nothing but the values themselves (no GPU, no launcher): a value out
of range, an unknown backend, or a contradiction between two fields (``backend="nccl"``
with ``compute_setup="cpu"``) fails at construction. Checks that need the machine (is
there a GPU? how many tasks did srun start?) are made by the launch environments when the
``Trainer`` is built, still before any work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ._callbacks._base import Callback
from ._config_rules import (
    _DTYPES,
    FIELD_RULES,
    _fail,
    _name,
    _warn,
)
from ._errors import ConfigError
from ._logging._base import is_logger
from ._logging._tools import ExperimentTrackingTool


def _warn_once(config: TrainConfig) -> None:
    """The warnings a configuration earns, each once per process (perceptrain's and ours)."""
    if config.live_plot_every:
        _warn(
            "live_plot",
            "TrainConfig(live_plot_every=...): live plots (livelossplot) are not available in "
            "marquardt.trainer; nothing is shown. HINT: use plot_every with "
            "plotting_functions, written to TensorBoard or MLflow",
        )
    if config.trainstop_criterion is not None:
        _warn(
            "trainstop",
            "TrainConfig(trainstop_criterion=...) is accepted but never called, as in "
            "perceptrain 0.1.0. HINT: stop from a Callback with trainer.stop_training()",
        )
    if config.plot_every and not config.plotting_functions:
        _warn(
            "plot_every",
            "TrainConfig(plot_every=...) without plotting_functions: no plots are written",
        )
    if config.checkpoint_best_only and config.validation_criterion is None:
        _warn(
            "best_only",
            "TrainConfig(checkpoint_best_only=True) without validation_criterion: no "
            "checkpoint is saved (perceptrain's meaning). HINT: validation_criterion=lambda "
            "val, best, eps: val < best - eps",
        )


#: ``log_folder``'s default: no folder given (the run gets a subfolder of ``root_folder``).
DEFAULT_LOG_FOLDER = Path("./")


@dataclass
class TrainConfig:
    """How to train: perceptrain 0.1.0's ``TrainConfig``, field for field, and ours beside it.

    Counting (perceptrain's): ``max_iter`` counts **epochs**. Training runs epochs
    0, 1, ..., ``max_iter`` (``max_iter + 1`` of them); epoch 0 trains like any other,
    and callbacks other than ``train_start`` do not run at epoch 0, so what is printed
    and written starts at epoch 1. An epoch is every batch of a loader with a length
    (``len(loader)``, at most ``Trainer(max_batches=...)``), one batch of a loader
    without one (an ``InfiniteTensorDataset``, a stream), or one evaluation when there
    is no data (a model that computes its own loss). With
    ``accumulate_grad_batches = a`` one optimizer step consumes ``a`` batches of the
    epoch. In a data-parallel run every process takes its share of each epoch.

    Periods are in epochs; 0 turns the action off.

    Arguments:
        max_iter: the last epoch (epochs 0 … ``max_iter`` run).
        print_every: period of the epoch's mean loss on the console (with ``verbose``).
        write_every: period of the metrics written to the tracking tool (and at the end).
        checkpoint_every: period of the checkpoints (and one at the end).
        plot_every: period of ``plotting_functions``, written to the tracking tool.
        live_plot_every: accepted for perceptrain's scripts; live plots are not
            available here (a warning says so).
        callbacks: the user's callbacks, run after the configuration's built-in ones.
        log_model: log the model to the tracking tool at the end.
        root_folder: the folder under which each run gets a subfolder.
        create_subfolder_per_run: always put the run in a new subfolder, even when
            ``log_folder`` is given.
        log_folder: a run writes into ``log_folder`` when one is given and holds no run
            yet; otherwise into a new subfolder ``<n>_<YYYYmmddTHHMMSS>_<pid in hex>`` of
            ``root_folder`` (or of the given ``log_folder``), ``n`` counting the runs
            there. A run never writes into another run's folder, except to resume it. The
            run folder holds perceptrain's checkpoint files
            (``model_<Model>_ckpt_<epoch>_device_<device>.pt``, ``opt_<Optimizer>_ckpt_...``),
            ``metrics.csv``, ``hparams.json``, the tracking tool's files and
            ``checkpoints/`` (the resume files).
        checkpoint_best_only: write only the best checkpoint
            (``model_<Model>_ckpt_best_device_<device>.pt`` and its ``opt_`` file), no
            numbered one.
        val_every: period of the validations (and one at the start).
        val_epsilon: the margin passed to ``validation_criterion``.
        validation_criterion: ``validation_criterion(val_loss, best_val_loss,
            val_epsilon) -> bool``, what counts as a better model for
            ``checkpoint_best_only``; without one, nothing is written, as in perceptrain.
        trainstop_criterion: accepted but never called, as in perceptrain 0.1.0 (a
            warning says so).
        batch_size: the batch size of tensors given to ``fit`` (or to ``Trainer``).
        verbose: print the metrics every ``print_every`` epochs.
        tracking_tool: an ``ExperimentTrackingTool`` (or its name), a logger instance,
            or a list of those; ``metrics.csv`` is always written as well.
        hyperparams: the user's hyper-parameters, logged once (string keys).
        plotting_functions: functions ``fn(model, epoch) -> (name, figure)`` (a list is
            made a tuple).
        _subfolders: the run folders this configuration has made (kept by the trainer).
        nprocs: the total number of training processes (the world size). Without a
            launcher, ``nprocs > 1`` spawns them; under torchrun the launcher's
            ``WORLD_SIZE`` rules; under srun, ``nprocs`` must equal the number of tasks or
            a multiple of it.
        compute_setup: ``"cpu"``, ``"gpu"`` or ``"auto"`` (GPUs when there are some).
        backend: ``"gloo"``, ``"nccl"``, ``"mpi"`` or ``"auto"`` (nccl on GPUs, gloo on
            CPUs).
        log_setup: ``"cpu"`` or ``"auto"``; metrics are always brought to the CPU to be
            logged, so both work alike here.
        dtype: the dtype the gradient and gradient-free loops train in (a floating
            ``torch.dtype`` or its name): the model and the batches' floating tensors are
            cast to it; ``None`` keeps their own (as the LM loop always does).
        all_reduce_metrics: average each step's metrics (and validation's) over the ranks.
        resume_from: ours: ``None`` (afresh, except in a requeued Slurm job, where it
            means ``"latest"``), ``"latest"`` (the newest run under the folder: its
            checkpoints, metrics and TensorBoard events), or a checkpoint path (the run
            that file belongs to).
        seed: ours: the seed of Python's, torch's and (if installed) NumPy's global
            generators in every process (``None``: not seeded).
        grad_clip: ours: the largest gradient norm (``None``: unclipped).
        accumulate_grad_batches: ours: batches per optimizer step.
        keep_checkpoints: ours: how many resume files ``checkpoints/`` keeps.
        on_nonfinite: ours: what a NaN or infinite training loss, or parameters that are
            not finite after a step, do: ``"stop"`` the run with ``NonFiniteLossError``
            (naming the step, the epoch, the batch and the last checkpoint), ``"skip"``
            the batch (the step is undone and taken on the next batch), or
            ``"continue"``. A checkpoint is never written from a non-finite model.
        dist_timeout: ours: seconds before a collective waiting on a dead peer fails.
        slice_size: ours: the LM loop's Jacobian slice (``None``: the whole batch).
        threads_per_process: ours: torch's (and the BLAS pools') threads in each training
            process; ``None``: ``OMP_NUM_THREADS`` where set, else a count the user set
            with ``torch.set_num_threads``, else the cores this process may use divided by
            the training processes on its node (``marquardt.devices.threads_per_process``).
        scheduler_interval: ours: ``Trainer(scheduler=...)`` is stepped per ``"epoch"``
            or per optimizer ``"step"`` (``ReduceLROnPlateau`` after each validation).
        scheduler_monitor: ours: the validation metric ``ReduceLROnPlateau`` watches.

    Raises:
        ConfigError: a field out of range or of the wrong kind, an unknown name
            (backend, compute setup, tracking tool, dtype, policy), or
            ``backend="nccl"`` with ``compute_setup="cpu"``.
    """

    max_iter: int = 10_000
    print_every: int = 0
    write_every: int = 0
    checkpoint_every: int = 0
    plot_every: int = 0
    live_plot_every: int = 0
    callbacks: list[Callback] = field(default_factory=list)
    log_model: bool = False
    root_folder: str | Path = Path("./qml_logs")
    create_subfolder_per_run: bool = False
    log_folder: str | Path = DEFAULT_LOG_FOLDER
    checkpoint_best_only: bool = False
    val_every: int = 0
    val_epsilon: float = 1e-5
    validation_criterion: Callable[..., bool] | None = None
    trainstop_criterion: Callable[..., bool] | None = None
    batch_size: int = 1
    verbose: bool = True
    tracking_tool: Any = ExperimentTrackingTool.TENSORBOARD
    hyperparams: dict[str, Any] = field(default_factory=dict)
    plotting_functions: tuple[Callable[..., Any], ...] = field(default_factory=tuple)
    _subfolders: list[str] = field(default_factory=list)
    nprocs: int = 1
    compute_setup: str = "cpu"
    backend: str = "gloo"
    log_setup: str = "cpu"
    dtype: torch.dtype | str | None = None
    all_reduce_metrics: bool = False
    # ours
    resume_from: str | Path | None = None
    seed: int | None = None
    grad_clip: float | None = None
    accumulate_grad_batches: int = 1
    keep_checkpoints: int = 3
    on_nonfinite: str = "stop"
    dist_timeout: float = 300.0
    slice_size: int | None = None
    threads_per_process: int | None = None
    scheduler_interval: str = "epoch"
    scheduler_monitor: str = "val_loss"

    def __post_init__(self) -> None:
        if isinstance(self.plotting_functions, list):
            self.plotting_functions = tuple(self.plotting_functions)
        for rule in FIELD_RULES:
            rule.check(self)
        if self.backend == "nccl" and self.compute_setup == "cpu":
            raise ConfigError(
                "TrainConfig(backend='nccl', compute_setup='cpu'): NCCL only moves CUDA tensors, "
                "so it cannot train on the CPU. HINT: use backend='gloo' on CPUs, or "
                "compute_setup='gpu' (or 'auto') on a machine with GPUs"
            )
        self.dtype = self._checked_dtype(self.dtype)
        self._check_tracking()
        self._check_paths()
        self.callbacks = list(self.callbacks)
        self.root_folder = Path(self.root_folder)
        self.log_folder = Path(self.log_folder)
        _warn_once(self)

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
        names = ExperimentTrackingTool.names()
        unknown = [t for t in self.tracking if isinstance(t, str) and t not in names]
        unknown += [repr(t) for t in self.tracking if not isinstance(t, str) and not is_logger(t)]
        if unknown:
            raise _fail(
                "tracking_tool",
                self.tracking_tool,
                f"tracking tools must be among {', '.join(names)}, or loggers "
                f"(objects with start, log_hyperparams, log_metrics, log_artifact and close); "
                f"unknown: {', '.join(map(repr, unknown))}",
                "e.g. tracking_tool='csv' or tracking_tool=['csv', MLflowLogger()]",
            )

    def _check_paths(self) -> None:
        if self.log_folder is None:  # marquardt-trainer 0.2's "no log folder"
            self.log_folder = DEFAULT_LOG_FOLDER
        for name in ("root_folder", "log_folder"):
            value = getattr(self, name)
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
            elif isinstance(value, tuple | list):
                value = [_name(v) for v in value]
            elif callable(value):
                value = _name(value)
            out[f.name] = value
        return out
