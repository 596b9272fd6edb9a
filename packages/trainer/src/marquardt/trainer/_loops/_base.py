"""The ``Loop`` protocol: what differs between the gradient (DDP) loop and the LM loop.

A loop owns the model and its optimizer (a torch optimizer, or an ``LMA``). The runner
(``_runner``) owns the schedule both share: counting steps over cycled epochs,
reporting, validating, agreeing on stops, checkpointing. A loop answers, once per run,
where it computes, how it joins a world of processes, which LR scheduler it takes and how
its optimizer travels to spawned processes, and then, per step, takes the next batch(es)
and returns a ``StepResult`` value; it saves and restores its own optimizer state (also
the state a spawned run hands back) and says in which dtype batches are evaluated.
Nothing else in the trainer asks which loop runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from .._config import TrainConfig


@dataclass(frozen=True)
class StepResult:
    """One step's loss and metrics; ``stop_reason`` when the loop asks the run to stop."""

    loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    stop_reason: str | None = None


def gpu_or_cpu(use_gpu: bool, gpu_index: Callable[[], int]) -> torch.device:
    """This process's GPU (made current) when the run uses GPUs, else the CPU."""
    if not use_gpu:
        return torch.device("cpu")
    index = gpu_index()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def place(model: nn.Module, device: torch.device, dtype: torch.dtype | None) -> None:
    """Move ``model`` to ``device`` and, when given, cast it to ``dtype``."""
    model.to(device=device)
    if dtype is not None:
        model.to(dtype=dtype)


class Loop(Protocol):
    """One training loop: a model, its optimizer, and how a step is taken."""

    #: The loop's name in checkpoints (a checkpoint resumes only the same kind).
    kind: str
    model: nn.Module
    optimizer: Any
    #: The dtype the floating tensors of batches are cast to (``None``: their own).
    dtype: torch.dtype | None

    @property
    def optimizer_name(self) -> str:
        """The optimizer's class name, which a resumed run must share."""

    def describe(self, backend: str) -> str:
        """How the run's opening line names this loop, e.g. ``DDP loop (gloo)``."""

    def check_world(self, launcher: str, world_size: int) -> None:
        """Raise ``ConfigError`` if this loop cannot run in ``world_size`` processes."""

    def check_scheduler(self, scheduler: Any, config: TrainConfig) -> None:
        """Raise ``ConfigError`` if ``Trainer(scheduler=...)`` cannot drive this loop."""

    def portable_optimizer(self) -> Any:
        """The optimizer as spawned processes get it (picklable; their ``Trainer`` takes it)."""

    def pick_device(self, use_gpu: bool, gpu_index: Callable[[], int]) -> torch.device:
        """This process's device (``gpu_index()`` gives the GPU its layout names)."""

    def setup(self, device: torch.device, world_size: int) -> None:
        """Move and wrap the model for ``world_size`` processes, before the first step."""

    def train(self) -> None:
        """Put the model in training mode."""

    def teardown(self) -> None:
        """Let go of whatever holds the process group, before the process leaves it."""

    @property
    def batches_per_step(self) -> int:
        """How many batches one step consumes (``accumulate_grad_batches``, or 1)."""

    def prepare_batch(self, batch: Any, device: torch.device) -> Any:
        """``batch`` where and how the step uses it (device, dtype); checked once."""

    def step(self, group: list[Any], device: torch.device) -> StepResult:
        """Take one optimizer (or LM) step on the prepared batches of ``group``."""

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's (or LMA's) state, under the checkpoint entries this loop owns."""

    def load_state_dict(self, entries: Mapping[str, Any]) -> None:
        """Take back what ``state_dict`` gave (from a checked checkpoint, or from rank 0 of
        a spawned run, in the process that spawned it)."""
