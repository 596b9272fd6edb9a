"""The checks ``Trainer`` makes of its arguments before any work.

Also the loaders it builds from tuples of tensors (``config.batch_size`` each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.devices._whole import is_whole

from ._config import TrainConfig
from ._errors import ConfigError


def as_loader(data: Any, batch_size: int, name: str) -> Any:
    """A tuple or list of tensors as a ``DataLoader`` of ``batch_size``; others as given."""
    if isinstance(data, tuple | list) and data and all(isinstance(t, torch.Tensor) for t in data):
        return DataLoader(TensorDataset(*data), batch_size=batch_size)
    if data is not None and callable(data) and not hasattr(data, "__iter__"):
        raise ConfigError(
            f"Trainer({name}=...): got a function where a DataLoader belongs. HINT: pass "
            "optimize_step by keyword (Trainer(model, optimizer, config, loss_fn, "
            "optimize_step=fn)): the fifth positional argument is train_dataloader"
        )
    return data


def check_arguments(
    config: TrainConfig | None,
    model: nn.Module,
    optimize_step: Callable[..., Any],
    max_batches: int | None,
) -> TrainConfig:
    """``Trainer``'s arguments checked (before any work); the configuration to use.

    Raises:
        ConfigError: a configuration that is not a ``TrainConfig``, a model that is not a
            module or has no trainable parameters, an ``optimize_step`` that cannot be
            called, or ``max_batches`` that is not a whole number >= 1 or None.
    """
    config = TrainConfig() if config is None else config
    if not isinstance(config, TrainConfig):
        raise ConfigError(
            f"Trainer(config={config!r}): expected a TrainConfig. "
            "HINT: Trainer(model, optimizer, TrainConfig(max_iter=100))"
        )
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"Trainer(model=...): expected a torch.nn.Module, got {type(model).__name__}. "
            "HINT: pass the network itself (a subclass of torch.nn.Module)"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"Trainer: the model ({type(model).__name__}) has no trainable parameters. "
            "HINT: check requires_grad, or that the layers are registered as submodules"
        )
    if not callable(optimize_step):
        raise ConfigError(
            f"Trainer(optimize_step=...): expected a callable, got "
            f"{type(optimize_step).__name__}. HINT: pass a function (model, optimizer, "
            "loss_fn, xs, device, dtype) -> (loss, metrics), or leave the default"
        )
    if max_batches is not None and not is_whole(max_batches, 1):
        raise ConfigError(
            f"Trainer(max_batches={max_batches!r}): a whole number >= 1 or None. HINT: "
            "None uses every batch of the loader in each epoch"
        )
    return config
