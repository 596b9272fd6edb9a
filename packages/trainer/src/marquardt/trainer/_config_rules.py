"""The checks of ``TrainConfig``'s single fields, as a table of rules.

The house form of their errors and their once-per-process warnings are here too.
``TrainConfig.__post_init__`` applies ``FIELD_RULES`` in order; checks that relate two
fields, or normalise a value, stay with the dataclass in ``_config``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marquardt.devices.messages import with_hint

from ._callbacks._base import Callback
from ._errors import ConfigError

COMPUTE_SETUPS = ("cpu", "gpu", "auto")
LOG_SETUPS = ("cpu", "auto")
PERIODS = ("print_every", "write_every", "checkpoint_every", "val_every", "plot_every")
_HINTS = {
    "validation_criterion": "e.g. lambda val_loss, best, eps: val_loss < best - eps",
    "trainstop_criterion": "leave it None: perceptrain 0.1.0 does not call it either",
}
BACKENDS = ("auto", "nccl", "gloo", "mpi")
SCHEDULER_INTERVALS = ("epoch", "step")
#: What a non-finite loss or model does (``marquardt.trainer._loops._nonfinite``).
NONFINITE_POLICIES = ("stop", "skip", "continue")
_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def _name(value: Any) -> Any:
    """A function by its name (for hparams.json and checkpoints), other values as they are."""
    if callable(value) and not isinstance(value, type):
        return getattr(value, "__qualname__", type(value).__name__)
    return value


def _fail(name: str, value: Any, need: str, hint: str) -> ConfigError:
    return ConfigError(with_hint(f"TrainConfig({name}={value!r}): {need}.", hint))


_warned: set[str] = set()


def _warn(key: str, text: str, category: type[Warning] = UserWarning) -> None:
    """Warn once per process for ``key``."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(text, category, stacklevel=5)


@dataclass(frozen=True)
class _Rule:
    """One field's check: ``ok(value)``, else ``TrainConfig(<field>=<value>): <need>.
    HINT: <hint>``. ``or_none``: ``None`` is accepted as well."""

    field: str
    ok: Callable[[Any], bool]
    need: str
    hint: str
    or_none: bool = False

    def check(self, config: Any) -> None:
        value = getattr(config, self.field)
        if (value is None and self.or_none) or self.ok(value):
            return
        raise _fail(self.field, value, self.need, self.hint)


def _is_number(value: Any) -> bool:
    """A finite real number (``True`` is not a number here)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _whole(field: str, minimum: int, hint: str, or_none: bool = False) -> _Rule:
    def ok(value: Any) -> bool:
        return not isinstance(value, bool) and isinstance(value, int) and value >= minimum

    return _Rule(field, ok, f"{field} must be a whole number >= {minimum}", hint, or_none)


def _one_of(field: str, choices: Sequence[str], hint: str, need: str = "") -> _Rule:
    need = need or f"{field} must be one of {', '.join(choices)}"
    return _Rule(field, lambda v: isinstance(v, str) and v in choices, need, hint)


def _flag(field: str) -> _Rule:
    return _Rule(
        field, lambda v: isinstance(v, bool), f"{field} must be True or False", f"e.g. {field}=True"
    )


def _function_or_none(field: str) -> _Rule:
    need = f"{field} must be a function or None"
    return _Rule(field, callable, need, _HINTS[field], or_none=True)


#: The checks of single fields, applied in this order by ``TrainConfig.__post_init__``
#: (checks that relate fields, or normalise them, follow the table there).
FIELD_RULES: tuple[_Rule, ...] = (
    _whole("max_iter", 0, "give the number of epochs, e.g. 100"),
    *(_whole(name, 0, f"use 0 to turn {name} off") for name in PERIODS),
    _whole("batch_size", 1, "the batch size of tensors given to fit"),
    _Rule(
        "val_epsilon",
        lambda v: _is_number(v) and v >= 0,
        "val_epsilon must be a finite number >= 0",
        "the margin a validation loss must improve by",
    ),
    _function_or_none("validation_criterion"),
    _function_or_none("trainstop_criterion"),
    _Rule(
        "plotting_functions",
        lambda v: isinstance(v, tuple) and all(callable(f) for f in v),
        "plotting_functions must be a tuple of functions fn(model, epoch) -> (name, figure)",
        "e.g. plotting_functions=(plot_fit,)",
    ),
    _one_of("log_setup", LOG_SETUPS, "'cpu' (the default) logs from the CPU"),
    _whole("nprocs", 1, "use 1 for a single process, or the world size"),
    _whole("accumulate_grad_batches", 1, "use 1 to step the optimizer after every batch"),
    _whole("keep_checkpoints", 1, "keep at least the newest one"),
    _one_of(
        "on_nonfinite",
        NONFINITE_POLICIES,
        "'stop' ends the run with an error, 'skip' undoes the step and skips the batch, "
        "'continue' goes on",
        need=f"on_nonfinite must be one of {', '.join(map(repr, NONFINITE_POLICIES))}",
    ),
    _whole("seed", 0, "use a non-negative integer, or None", or_none=True),
    _whole("slice_size", 1, "use None for the whole batch", or_none=True),
    _whole(
        "threads_per_process", 1, "use None for the cores divided by the processes", or_none=True
    ),
    _one_of(
        "compute_setup",
        COMPUTE_SETUPS,
        "'auto' uses GPUs when there are some and the CPU otherwise",
    ),
    _one_of(
        "backend",
        BACKENDS,
        "use 'nccl' on GPUs, 'gloo' on CPUs, or 'auto' to choose by compute_setup",
    ),
    _one_of(
        "scheduler_interval",
        SCHEDULER_INTERVALS,
        "'epoch' steps the LR scheduler after each epoch, 'step' after each optimizer step",
        need="scheduler_interval must be 'epoch' or 'step'",
    ),
    _Rule(
        "scheduler_monitor",
        lambda v: isinstance(v, str) and bool(v),
        "scheduler_monitor must name a validation metric",
        "e.g. scheduler_monitor='val_loss' (what ReduceLROnPlateau watches)",
    ),
    *(
        _flag(name)
        for name in (
            "create_subfolder_per_run",
            "all_reduce_metrics",
            "verbose",
            "checkpoint_best_only",
            "log_model",
        )
    ),
    _Rule(
        "grad_clip",
        lambda v: _is_number(v) and v > 0,
        "grad_clip must be a finite number > 0 (the largest gradient norm)",
        "use None to leave gradients unclipped, e.g. grad_clip=1.0",
        or_none=True,
    ),
    _Rule(
        "dist_timeout",
        lambda v: _is_number(v) and v > 0,
        "dist_timeout must be a positive number of seconds",
        "e.g. dist_timeout=300; a dead peer is detected within this time",
    ),
    _Rule(
        "callbacks",
        lambda v: isinstance(v, list | tuple) and all(isinstance(c, Callback) for c in v),
        "callbacks must be a list of marquardt.trainer.Callback instances",
        "subclass Callback and pass instances, e.g. callbacks=[EarlyStopping()]",
    ),
    _Rule("_subfolders", lambda v: isinstance(v, list), "a list of run folder names", "[]"),
    _Rule(
        "hyperparams",
        lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
        "hyperparams must be a dict with string keys",
        "e.g. hyperparams={'lr': 0.01}",
    ),
)
