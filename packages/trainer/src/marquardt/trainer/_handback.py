"""What crosses between a spawning parent and its training processes, besides the data.

Forward: a torch optimizer cannot be pickled apart from its model (its state refers to
the parameters), so it travels as class, hyper-parameters, parameter indices and state,
and is rebuilt around each process's copy of the model. Back: rank 0 writes the trained
model and optimizer state, its callbacks' states and the final step to a file
(atomically), which the parent loads into the caller's own model, optimizer and callbacks
(so ``EarlyStopping.best`` reads the same in the caller as in the run); every rank holds
the same weights, so rank 0's are the run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import _callback_state as callback_state
from . import _checkpoint as ckpt

if TYPE_CHECKING:
    from ._trainer import Trainer


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


def write_result(trainer: Trainer, path: str) -> None:
    """Rank 0 of a spawn: the trained state, for the parent."""
    state = trainer.state
    ckpt.atomic_save(
        {
            "model": ckpt.bare_state_dict(trainer.model),
            "optimizer": trainer.optimizer.state_dict(),
            "step": state.step,
            "interrupted": state.interrupted,
            "stop_reason": state.stop_reason,
            callback_state.ENTRY: [callback_state.capture(trainer.config.callbacks)],
        },
        path,
    )


def read_result(path: str) -> dict[str, Any]:
    """In the parent: what rank 0 wrote with :func:`write_result`."""
    result: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return result


def apply_result(trainer: Trainer, result: dict[str, Any]) -> None:
    """In the parent: the caller's model and optimizer get rank 0's trained state."""
    trainer.model.load_state_dict(result["model"])
    trainer.optimizer.load_state_dict(result["optimizer"])
    trainer.state.step = int(result["step"])
    trainer.state.stop_reason = str(result.get("stop_reason", ""))
    trainer.state.interrupted = bool(result["interrupted"])
    callback_state.restore(result, trainer.config.callbacks, rank=0, world_size=1)
