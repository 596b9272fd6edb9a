"""``RunContext``: what the parts of a run share, passed to them instead of the ``Trainer``.

The ``Trainer`` builds it once per process (configuration, state, loop, callbacks, LR
schedule, loss, compute, launcher); the worker fills in the run folder, the logger and the
sampler seed once the ranks agreed on them. The runner, validation and persistence read
it; what changes during a run is the ``TrainerState`` it holds, which callbacks read.
Checkpoints are written through the ``Checkpoints`` the worker gives it, so the
loops do not depend on the persistence package, which depends on this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from marquardt.devices import ThreadChoice

from .._callbacks._base import Callback
from .._callbacks._dispatch import StageDispatch
from .._compute import Compute
from .._config import TrainConfig
from .._logging._run_logger import RunLogger
from .._state import TrainerState
from ._base import Loop
from ._torch_lr_scheduler import LRSchedule


class Checkpoints(Protocol):
    """Where the runner's checkpoints go (``marquardt.trainer._persistence``)."""

    def save(self) -> None:
        """A numbered checkpoint of the run as it stands."""

    def save_best(self) -> None:
        """``best.pt``: the run at its lowest validation loss so far."""


@dataclass
class RunContext:
    """One process's view of a run."""

    config: TrainConfig
    state: TrainerState
    loop: Loop
    #: The user's callbacks (whose states the checkpoints hold).
    callbacks: list[Callback]
    #: The trainer the callbacks and hook methods receive.
    owner: Any
    schedule: LRSchedule
    loss_fn: Callable[..., Any]
    compute: Compute
    launcher: str
    folder: Path = Path()
    logger: RunLogger | None = None
    checkpoints: Checkpoints | None = None
    sampler_seed: int = 0
    max_batches: int | None = None
    stages: StageDispatch = None  # type: ignore[assignment]  # set by the worker
    #: The threads of this process: a spawning parent's choice, else made by the worker.
    threads: ThreadChoice | None = None

    @property
    def model(self) -> nn.Module:
        """The bare model (not wrapped in DDP)."""
        return self.loop.model

    def describe(self) -> str:
        """The run's first line: loop, launcher, world size, device, epochs."""
        return (
            f"{self.loop.describe(self.compute.backend)}, {self.launcher}, world size "
            f"{self.state.world_size}, device {self.state.device}, epochs 0-{self.config.max_iter}"
        )
