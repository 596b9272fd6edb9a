"""The gradient loop's own parts: checks, one optimizer step, the DDP wrapper.

DDP (Li et al. 2020, "PyTorch Distributed"): every process holds a replica of the model
and takes its own share of each global batch; the backward pass averages the gradients,
ḡ = (1/W) Σ_r ∇L_r(θ), so every replica takes the same optimizer step and the replicas
stay identical. With equal per-rank batches and a mean loss, ḡ is the gradient of the
mean loss over the global batch: W processes of batch b follow the same path as one
process of batch W·b. With ``accumulate_grad_batches = a`` a step averages a batches
(:func:`marquardt.trainer.optimize_step._accumulate_step`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._callbacks import run_hook
from ._config import TrainConfig
from ._errors import ConfigError
from .optimize_step import _accumulate_step, optimize_step

if TYPE_CHECKING:
    from ._trainer import Trainer


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


def wrap(model: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """``model`` in ``DistributedDataParallel`` when several processes train it."""
    if world_size <= 1:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def gradient_step(
    trainer: Trainer, net: nn.Module, batches: Iterator[Any]
) -> tuple[float, dict[str, float]]:
    """One optimizer step on the next ``accumulate_grad_batches`` batches."""
    cfg, state = trainer.config, trainer.state
    count = cfg.accumulate_grad_batches
    group = [next(batches) for _ in range(count)]
    run_hook(trainer, "on_batch_start", group[0] if count == 1 else group)
    extra = {} if cfg.grad_clip is None else {"grad_clip": cfg.grad_clip}
    optimizer, loss_fn = trainer.optimizer, trainer.loss_fn
    if count == 1:
        loss_t, raw = trainer.optimize_step(
            net, optimizer, loss_fn, group[0], state.device, cfg.torch_dtype, **extra
        )
    else:
        loss_t, raw = _accumulate_step(
            net, optimizer, loss_fn, group, state.device, cfg.torch_dtype, **extra
        )
    return float(loss_t), {k: float(v) for k, v in raw.items()}
