"""``WorkerSpec``: everything a spawned process needs to build its ``Trainer``, picklable.

The optimizer travels as its loop says (``Loop.portable_optimizer``: a torch optimizer
as an ``OptimizerSpec``, rebuilt here around the process's copy of the model; the LM
loop's factory as it is); an LR scheduler travels as class, constructor arguments found
in its state, and state (``SchedulerSpec``). The spawned process then builds its
``Trainer`` through the class's own constructor, with a ``SpawnedProcess`` environment
holding its layout.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marquardt.devices import ThreadChoice

from .._config import TrainConfig
from .._data._sources import DataSource
from .._environments import ProcessLayout, SpawnedProcess
from .._errors import ConfigError
from .._loops._gradient import OptimizerSpec
from .._persistence._plan import RunPlan


@dataclass
class SchedulerSpec:
    """An LR scheduler as class, constructor arguments (read from its state) and state."""

    cls: type
    arguments: dict[str, Any]
    state: dict[str, Any]

    @classmethod
    def capture(cls, scheduler: Any) -> SchedulerSpec:
        state = dict(scheduler.state_dict())
        arguments: dict[str, Any] = {}
        missing: list[str] = []
        for name, param in list(inspect.signature(type(scheduler).__init__).parameters.items())[2:]:
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name == "last_epoch":
                continue
            if name in state:
                arguments[name] = state[name]
            elif param.default is inspect.Parameter.empty:
                missing.append(name)
        if missing:
            raise ConfigError(
                f"the {type(scheduler).__name__} cannot be rebuilt in the spawned processes: "
                f"its state does not hold {', '.join(missing)}. HINT: launch with torchrun or "
                "srun (one task per process), where nothing is rebuilt, or use a scheduler "
                "whose settings are in its state_dict (StepLR, MultiStepLR, ReduceLROnPlateau...)"
            )
        return cls(type(scheduler), arguments, state)

    def build(self, optimizer: torch.optim.Optimizer) -> Any:
        saved = optimizer.state_dict()
        scheduler = self.cls(optimizer, **self.arguments)
        scheduler.load_state_dict(self.state)
        optimizer.load_state_dict(saved)  # constructing the scheduler may have set the lr
        return scheduler


@dataclass
class WorkerSpec:
    """A spawned process's ``Trainer`` (class, arguments) and run (plan, data, result file)."""

    trainer_class: type
    model: nn.Module
    #: The loop's portable optimizer: a torch optimizer's spec, or the LMA factory (called
    #: in the process, after the rendezvous).
    optimizer: Any
    scheduler: SchedulerSpec | None
    config: TrainConfig
    loss_fn: Any
    optimize_step: Any
    data: DataSource
    plan: RunPlan
    result_path: str
    launcher: str
    gpu_count: int
    use_gpu: bool
    use_grad: bool = True
    max_batches: int | None = None
    #: The threads every spawned process runs (chosen once, in the spawning parent).
    threads: ThreadChoice | None = None

    def build(self, layout: ProcessLayout) -> Any:
        """The ``Trainer`` of the process at ``layout``, through its own constructor."""
        optimizer = self.optimizer
        if isinstance(optimizer, OptimizerSpec):
            optimizer = optimizer.build(self.model)
        scheduler = None if self.scheduler is None else self.scheduler.build(optimizer)
        environment = SpawnedProcess(layout, self.launcher, self.gpu_count, self.use_gpu)
        self.trainer_class.set_use_grad(self.use_grad)  # type: ignore[attr-defined]  # fresh class
        return self.trainer_class(
            self.model,
            optimizer,
            self.config,
            loss_fn=self.loss_fn,
            optimize_step=self.optimize_step,
            max_batches=self.max_batches,
            scheduler=scheduler,
            environment=environment,
        )
