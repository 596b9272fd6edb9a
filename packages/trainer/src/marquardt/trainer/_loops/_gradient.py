"""``GradientLoop``: a torch optimizer, one ``optimize_step`` per step, DDP over processes.

DDP (Li et al. 2020, "PyTorch Distributed"): every process holds a replica of the model
and takes its own share of each global batch; the backward pass averages the gradients,
ḡ = (1/W) Σ_r ∇L_r(θ), so every replica takes the same optimizer step and the replicas
stay identical. With equal per-rank batches and a mean loss, ḡ is the gradient of the
mean loss over the global batch: W processes of batch b follow the same path as one
process of batch W·b. With ``accumulate_grad_batches = a`` a step averages a batches
(``marquardt.trainer.optimize_step._accumulate_step``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._config import TrainConfig
from .._errors import ConfigError
from ..optimize_step import _accumulate_step, _to, optimize_step
from ._base import StepResult, gpu_or_cpu, place
from ._torch_lr_scheduler import check_scheduler


def check_torch_optimizer(
    optimizer: Any, model: nn.Module, config: TrainConfig, step_fn: Callable[..., Any]
) -> None:
    """The optimizer is a torch optimizer over this model's parameters, and ``config``'s
    accumulation and clipping work with it and with ``step_fn``."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        hint = (
            "install the lm extra (pip install marquardt-trainer[lm]) for LMA"
            if type(optimizer).__name__ == "LMA"
            else "e.g. torch.optim.SGD(model.parameters(), lr=0.01)"
        )
        raise ConfigError(
            f"Trainer(optimizer=...): expected a torch.optim.Optimizer or a "
            f"marquardt.solver.LMA, got {type(optimizer).__name__}. HINT: {hint}"
        )
    own = {id(p) for p in model.parameters()}
    foreign = sum(1 for g in optimizer.param_groups for p in g["params"] if id(p) not in own)
    if foreign:
        raise ConfigError(
            f"the optimizer holds {foreign} parameter(s) that are not the model's. HINT: "
            "build it from this model, e.g. SGD(model.parameters(), lr=0.01)"
        )
    custom_step = step_fn is not optimize_step
    if config.accumulate_grad_batches > 1:
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ConfigError(
                "accumulate_grad_batches > 1 with LBFGS: L-BFGS re-evaluates the loss inside "
                "its step, which needs every batch at once. HINT: use a larger batch_size "
                "instead, or accumulate_grad_batches=1"
            )
        if custom_step:
            raise ConfigError(
                "accumulate_grad_batches > 1 with a custom optimize_step: the trainer "
                "accumulates with its own step. HINT: accumulate inside your optimize_step "
                "and keep accumulate_grad_batches=1"
            )
    if config.grad_clip is not None and custom_step:
        params = inspect.signature(step_fn).parameters
        if "grad_clip" not in params and not any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        ):
            raise ConfigError(
                "TrainConfig.grad_clip is set but the custom optimize_step takes no "
                "grad_clip argument. HINT: add a keyword argument grad_clip=None to it, or "
                "clip inside it and leave grad_clip=None"
            )


@dataclass
class OptimizerSpec:
    """A torch optimizer as class, hyper-parameters and state, rebuilt around a model copy."""

    cls: type
    defaults: dict[str, Any]
    groups: list[tuple[list[int], dict[str, Any]]]
    state: dict[str, Any]

    @classmethod
    def capture(cls, optimizer: torch.optim.Optimizer, model: nn.Module) -> OptimizerSpec:
        index = {id(p): i for i, p in enumerate(model.parameters())}
        groups = [
            (
                [index[id(p)] for p in group["params"]],
                {k: v for k, v in group.items() if k != "params"},
            )
            for group in optimizer.param_groups
        ]
        return cls(type(optimizer), dict(optimizer.defaults), groups, optimizer.state_dict())

    def build(self, model: nn.Module) -> torch.optim.Optimizer:
        params = list(model.parameters())
        groups = [{"params": [params[i] for i in idx], **hp} for idx, hp in self.groups]
        try:
            optimizer = self.cls(groups, **self.defaults)
        except TypeError:
            optimizer = self.cls(groups)
        optimizer.load_state_dict(self.state)
        return optimizer


class GradientLoop:
    """The DDP loop: ``optimize_step`` (or accumulation over several batches) per step."""

    kind = "ddp"

    @property
    def optimizer_name(self) -> str:
        return type(self.optimizer).__name__

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[..., Any],
        step_fn: Callable[..., Any],
        config: TrainConfig,
    ) -> None:
        check_torch_optimizer(optimizer, model, config, step_fn)
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.step_fn = step_fn
        self.accumulate = config.accumulate_grad_batches
        self.grad_clip = config.grad_clip
        self.dtype = config.torch_dtype
        self.net: nn.Module = model

    def describe(self, backend: str) -> str:
        return f"DDP loop ({backend})"

    def check_world(self, launcher: str, world_size: int) -> None:
        """Any number of processes: DDP averages their gradients."""

    def check_scheduler(self, scheduler: Any, config: TrainConfig) -> None:
        check_scheduler(scheduler, self.optimizer, config)

    def portable_optimizer(self) -> OptimizerSpec:
        """A torch optimizer cannot be pickled apart from its model (its state refers to the
        parameters): it travels as an ``OptimizerSpec``."""
        return OptimizerSpec.capture(self.optimizer, self.model)

    def pick_device(self, use_gpu: bool, gpu_index: Callable[[], int]) -> torch.device:
        return gpu_or_cpu(use_gpu, gpu_index)

    def setup(self, device: torch.device, world_size: int) -> None:
        place(self.model, device, self.dtype)
        if world_size > 1:
            device_ids = [device.index] if device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids)

    def train(self) -> None:
        self.net.train()

    def teardown(self) -> None:
        """Drop the DDP wrapper: its reducer holds the process group, and a group still held
        when the interpreter exits after ``destroy_process_group`` makes gloo abort the
        process ("terminate called without an active exception")."""
        self.net = self.model

    @property
    def batches_per_step(self) -> int:
        return self.accumulate

    def prepare_batch(self, batch: Any, device: torch.device) -> Any:
        """Tensors of ``batch`` on ``device``; floating ones in the training dtype."""
        return _to(batch, device, self.dtype)

    def step(self, group: list[Any], device: torch.device) -> StepResult:
        """One optimizer step on ``group`` (one batch, or ``accumulate_grad_batches``)."""
        extra = {} if self.grad_clip is None else {"grad_clip": self.grad_clip}
        if len(group) == 1:
            loss, raw = self.step_fn(
                self.net, self.optimizer, self.loss_fn, group[0], device, self.dtype, **extra
            )
        else:
            loss, raw = _accumulate_step(
                self.net, self.optimizer, self.loss_fn, group, device, self.dtype, **extra
            )
        return StepResult(float(loss), {k: float(v) for k, v in (raw or {}).items()})

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "lma": None}

    def load_state_dict(self, entries: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(entries["optimizer"])
