"""``LMLoop``: one Levenberg-Marquardt step of an ``LMA`` per batch, in one process.

Each batch is one Levenberg-Marquardt step (Levenberg 1944, Marquardt 1963),
δ = (JᵀJ + λD)⁻¹ Jᵀr, taken by ``marquardt.solver.LMA``: no backward pass, and the step
report's damping λ, attempts and acceptance become the step's metrics. The run stops when
LM terminates (the MINPACK tests ``gtol``, ``ftol``, ``xtol`` of Moré 1978, or the
damping at ``damping_max``), with the report's reason. LM's data parallelism lives inside
``LMA`` (slices on several devices), so the loop runs in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .._callbacks import Hooks
from .._config import TrainConfig
from .._errors import ConfigError
from ..optimize_step import _split
from ._base import StepResult


def _lma_class() -> type | None:
    """``marquardt.solver.LMA`` if the ``lm`` extra is installed (imported lazily)."""
    try:
        from marquardt.solver import LMA
    except ImportError:
        return None
    return LMA


def is_lma(obj: Any) -> bool:
    """Whether ``obj`` is a ``marquardt.solver.LMA`` (False when the solver is absent)."""
    cls = _lma_class()
    return cls is not None and isinstance(obj, cls)


def check_lma(lma: Any, model: nn.Module, config: TrainConfig) -> None:
    """The LM loop runs in one process, on the model the LMA was built for."""
    if config.nprocs > 1:
        raise ConfigError(
            f"TrainConfig(nprocs={config.nprocs}) with an LMA: the LM loop runs in one "
            "process. HINT: set nprocs=1; LM is data-parallel inside LMA (pass several "
            "devices to LMA(model, devices, residual_fn))"
        )
    if getattr(lma, "model", model) is not model:
        raise ConfigError(
            "Trainer(model, lma): the LMA was built for another model object. HINT: "
            "pass the model given to LMA(model, ...)"
        )


def check_single_process(launcher: str, world_size: int) -> None:
    """A launcher that started several processes cannot run the LM loop."""
    if world_size > 1:
        raise ConfigError(
            f"the LM loop runs in one process but {launcher} starts "
            f"{world_size}. HINT: LM is data-parallel inside LMA: give it "
            "several devices (LMA(model, devices, ...)) and launch one process"
        )


class LMLoop:
    """The LM loop: ``lma.step(inputs, targets, slice_size)`` per batch; stops when LM does."""

    kind = "lm"

    def __init__(self, model: nn.Module, lma: Any, config: TrainConfig) -> None:
        check_lma(lma, model, config)
        self.model = model
        self.optimizer = lma
        self.slice_size = config.slice_size

    def describe(self, backend: str) -> str:
        return "LM loop"

    def check_world(self, launcher: str, world_size: int) -> None:
        check_single_process(launcher, world_size)

    def pick_device(self, use_gpu: bool, gpu_index: Callable[[], int]) -> torch.device:
        """The device the LMA's model lives on (LMA spreads slices over its own devices)."""
        return next(self.model.parameters()).device

    def setup(self, device: torch.device, world_size: int) -> None:
        """LMA placed the model and its replicas itself."""

    def train(self) -> None:
        self.model.train()

    def step(self, batches: Iterator[Any], hooks: Hooks, device: torch.device) -> StepResult:
        """One LM step on the next batch; asks to stop when LM terminates."""
        batch = next(batches)
        hooks("on_batch_start", batch)
        inputs, targets = _split(batch)
        slice_size = self.slice_size
        if slice_size is not None:
            # A loader's last batch may be shorter than the configured slice; LMA refuses a
            # slice larger than its batch, so the slice shrinks to that batch.
            slice_size = min(slice_size, len(inputs))
        loss, terminated = self.optimizer.step(inputs, targets, slice_size)
        report = getattr(self.optimizer, "report", None)
        metrics: dict[str, float] = {}
        for name in ("damping", "attempts", "accepted"):
            value = getattr(report, name, None)
            if isinstance(value, int | float | bool):
                metrics[name] = float(value)
        stop = None
        if terminated:
            reason = getattr(report, "reason", "") or getattr(report, "termination", "")
            stop = f"LM terminated: {reason}".rstrip(": ")
        return StepResult(float(loss), metrics, stop)

    def eval_batch(self, batch: Any, device: torch.device) -> tuple[Any, Any]:
        inputs, targets = _split(batch)
        return inputs.to(device), targets.to(device)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": None, "lma": self.optimizer.state_dict()}

    def load_state_dict(self, entries: Mapping[str, Any]) -> None:
        """The LMA's damping state; then its replicas on other devices take the loaded weights.

        ``load_state_dict`` of the model writes into the source model, whose trainable
        parameters are views of its replica's flat vector; replicas on other devices still
        hold the old values until ``sync_replicas``.
        """
        self.optimizer.load_state_dict(entries["lma"])
        self.optimizer.sync_replicas()
