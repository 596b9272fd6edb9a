"""``LMLoop``: one Levenberg-Marquardt step of an ``LMA`` per batch, in one or several processes.

Each batch is one Levenberg-Marquardt step (Levenberg 1944, Marquardt 1963),
δ = (JᵀJ + λD)⁻¹ Jᵀr, taken by ``marquardt.solver.LMA``: no backward pass, and the step
report's damping λ, attempts and acceptance become the step's metrics. The run stops when
LM terminates (the MINPACK tests ``gtol``, ``ftol``, ``xtol`` of Moré 1978, or the
damping at ``damping_max``), with the report's reason.

In one process the loop takes the user's ``LMA`` (its data parallelism is over the model
devices it was given). In W processes every step is one step of the *global* batch: each
rank takes its share from the ``DistributedSampler``, computes the Jacobian products of
its share, and the ``LMA`` combines them over the process group (all-reduce of JᵀJ, Jᵀr,
‖r‖², N; see ``marquardt.solver.LMA``'s ``process_group``), so λ, the decisions and θ are
the same on every rank. An ``LMA`` in a process group can only be built once the group
exists, inside each training process, so the loop then takes an *LMA factory*
``make_lma(model, process_group=...) -> LMA``, called in each process after the rendezvous
with ``process_group="default"`` (``None`` in a single process); ``functools.partial(LMA,
devices=..., residual_fn=torch.sub)`` is one. The checkpoint holds the
LMA's state (λ, ν, step count) and its last step report. The process that spawned a run
builds an LMA of its own model for one process when it takes rank 0's trained state back.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .._config import TrainConfig
from .._errors import ConfigError
from .._loss import split_batch
from ._base import StepResult


def is_lma(obj: Any) -> bool:
    """Whether ``obj`` is a ``marquardt.solver.LMA`` (False, without importing it, if the
    solver is absent or not imported).

    An object can only be an ``LMA`` once ``marquardt.solver`` has been imported, so the
    check looks in ``sys.modules``: a run with a torch optimizer does not pay for importing
    the solver (and SciPy with it; about 0.3 s).
    """
    solver = sys.modules.get("marquardt.solver")
    cls = getattr(solver, "LMA", None)
    return isinstance(cls, type) and isinstance(obj, cls)


_FACTORY_HINT = (
    "pass a factory instead, Trainer(model, make_lma, config) with make_lma(model, "
    "process_group) returning LMA(model, devices, residual_fn, process_group=process_group), "
    "defined at module level (or functools.partial(LMA, devices=devices, "
    "residual_fn=torch.sub)); each process calls it after joining the process group"
)


def check_lma(lma: Any, model: nn.Module, config: TrainConfig) -> None:
    """An LMA instance runs in one process, on the model it was built for."""
    if config.nprocs > 1:
        raise ConfigError(
            f"TrainConfig(nprocs={config.nprocs}) with an LMA built beforehand: an LMA shared "
            "by several processes must be built inside each of them, after the process group "
            f"exists. HINT: {_FACTORY_HINT}"
        )
    if getattr(lma, "model", model) is not model:
        raise ConfigError(
            "Trainer(model, lma): the LMA was built for another model object. HINT: "
            "pass the model given to LMA(model, ...)"
        )


def check_single_process(launcher: str, world_size: int) -> None:
    """A launcher that started several processes needs an LMA factory, not an instance."""
    if world_size > 1:
        raise ConfigError(
            f"the LM loop with an LMA built beforehand runs in one process but {launcher} "
            f"starts {world_size}. HINT: {_FACTORY_HINT}"
        )


def build_lma(factory: Callable[..., Any], model: nn.Module, world_size: int) -> Any:
    """``factory(model, "default" | None)``, checked to be an LMA of ``model`` for the world."""
    group = "default" if world_size > 1 else None
    lma = factory(model, process_group=group)
    if not is_lma(lma):
        raise ConfigError(
            f"the LMA factory {getattr(factory, '__name__', factory)!r} returned a "
            f"{type(lma).__name__}, not an LMA. HINT: {_FACTORY_HINT}"
        )
    if lma.model is not model:
        raise ConfigError(
            "the LMA factory built an LMA for another model. HINT: build it from the model "
            "it is given: LMA(model, devices, residual_fn, process_group=process_group)"
        )
    if getattr(lma, "world_size", 1) != world_size:
        raise ConfigError(
            f"the LMA factory built an LMA for {getattr(lma, 'world_size', 1)} process(es) but "
            f"{world_size} train. HINT: pass process_group=process_group on to LMA(...)"
        )
    return lma


def is_lma_factory(obj: Any) -> bool:
    """A callable that is neither an LMA nor a torch optimizer: ``make_lma(model, group)``."""
    return callable(obj) and not is_lma(obj) and not isinstance(obj, torch.optim.Optimizer)


class LMLoop:
    """The LM loop: ``lma.step(inputs, targets, slice_size)`` per batch; stops when LM does."""

    kind = "lm"
    optimizer_name = "LMA"
    #: LM casts nothing: the LMA works in the dtype of the model and the batches.
    dtype: torch.dtype | None = None

    def __init__(self, model: nn.Module, lma: Any, config: TrainConfig) -> None:
        self.factory: Callable[..., Any] | None = None
        if is_lma(lma):
            check_lma(lma, model, config)
        else:
            self.factory = lma
        self.model = model
        self.optimizer = lma
        self.slice_size = config.slice_size

    def describe(self, backend: str) -> str:
        return "LM loop"

    def check_world(self, launcher: str, world_size: int) -> None:
        if self.factory is None:
            check_single_process(launcher, world_size)

    def check_scheduler(self, scheduler: Any, config: TrainConfig) -> None:
        """LM has no learning rate: any scheduler is refused."""
        if scheduler is not None:
            raise ConfigError(
                "Trainer(scheduler=...) with an LMA: LM has no learning rate to schedule "
                "(its damping adapts itself). HINT: leave scheduler=None in the LM loop"
            )

    def portable_optimizer(self) -> Any:
        """The LMA factory: each spawned process builds its LMA after the rendezvous."""
        return self.factory if self.factory is not None else self.optimizer

    def pick_device(self, use_gpu: bool, gpu_index: Callable[[], int]) -> torch.device:
        """The device the LMA's model lives on (LMA spreads slices over its own devices)."""
        return next(self.model.parameters()).device

    def setup(self, device: torch.device, world_size: int) -> None:
        """Build the LMA from the factory (in the process group when W > 1)."""
        if self.factory is not None:
            self.optimizer = build_lma(self.factory, self.model, world_size)

    def train(self) -> None:
        self.model.train()

    batches_per_step = 1

    def prepare_batch(self, batch: Any, device: torch.device) -> Any:
        """The batch as it is: the LMA moves its slices to its own devices."""
        if batch is None:
            raise ConfigError(
                "the LM loop fits residuals of (inputs, targets) batches but there is no "
                "data. HINT: pass a train_dataloader of (x, y) pairs"
            )
        return batch

    def step(self, group: list[Any], device: torch.device) -> StepResult:
        """One LM step on the batch; asks to stop when LM terminates."""
        inputs, targets = split_batch(group[0])
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

    def teardown(self) -> None:
        """Nothing: an LMA looks the default group up at each collective, never holds it."""

    def state_dict(self) -> dict[str, Any]:
        report = getattr(self.optimizer, "report", None)
        plain = None
        if dataclasses.is_dataclass(report) and not isinstance(report, type):
            plain = {
                k: v
                for k, v in dataclasses.asdict(report).items()
                if v is None or isinstance(v, bool | int | float | str)
            }
        return {"optimizer": None, "lma": self.optimizer.state_dict(), "lm_report": plain}

    def load_state_dict(self, entries: Mapping[str, Any]) -> None:
        """The LMA's damping state; then its replicas on other devices take the loaded weights.

        ``load_state_dict`` of the model writes into the source model, whose trainable
        parameters are views of its replica's flat vector; replicas on other devices still
        hold the old values until ``sync_replicas``. In the process that spawned the run,
        which holds the factory only, the LMA of the model for one process is built first.
        """
        if not is_lma(self.optimizer):
            self.optimizer = build_lma(self.optimizer, self.model, world_size=1)
        self.optimizer.load_state_dict(entries["lma"])
        self.optimizer.sync_replicas()
