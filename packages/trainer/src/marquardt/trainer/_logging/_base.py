"""The ``Logger`` protocol every tracking tool implements, and one-line notices on stderr.

A logger receives, on rank 0 only: ``start`` (the run folder and the first step, once),
``log_hyperparams`` (the configuration and ``TrainConfig.hyperparams``, once),
``log_metrics`` (every ``write_every`` steps and at each validation), ``log_artifact``
(the final checkpoint) and ``close``. ``TrainConfig.tracking_tool`` takes names
(``"csv"``, ``"tensorboard"``, ``"mlflow"``) or instances of any class with these methods.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

METHODS = ("start", "log_hyperparams", "log_metrics", "log_artifact", "close")


@runtime_checkable
class Logger(Protocol):
    """A tracking tool: where a run's parameters, metrics and final model go."""

    def start(self, folder: Path, start_step: int) -> None:
        """The run folder and the step the run starts from (a resumed run rewrites later ones)."""

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """The configuration and the user's hyper-parameters, once per run."""

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, epoch: int, phase: str
    ) -> None:
        """The metrics of ``step`` (``phase`` is ``"train"`` or ``"val"``)."""

    def log_artifact(self, path: Path) -> None:
        """A file the run produced (the final checkpoint)."""

    def close(self) -> None:
        """The run is over (flush, end the tracking run)."""


def is_logger(obj: Any) -> bool:
    """Whether ``obj`` has every method of ``Logger``."""
    return all(callable(getattr(obj, name, None)) for name in METHODS)


def notice(message: str) -> None:
    """A one-line notice for the user, on stderr."""
    sys.stderr.write(f"marquardt.trainer: {message}\n")
    sys.stderr.flush()


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``a.b`` keys (for tools that take flat parameters)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
