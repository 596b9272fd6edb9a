"""The loss of a batch, ``loss_fn(batch, model) -> (loss, metrics)``: perceptrain's convention.

Every loop, validation and test pass, and every ``optimize_step``, calls the loss one way:
``loss_fn(batch, model)``, returning the loss and a dict of metrics; ``batch`` is ``None``
when there is no data (a model that computes its own loss). What ``Trainer(loss_fn=...)``
accepts is turned into that form once, here:

- ``"mse"``, ``"cross_entropy"``: ``criterion(model(x), y)`` on a batch ``(x, y)``, no
  metrics (perceptrain's built-in losses);
- a ``torch.nn.Module`` (``nn.MSELoss()``, ...): a criterion ``(outputs, targets)``;
- a function whose second parameter is named ``model`` or annotated ``nn.Module``
  (``def loss_fn(batch, model)``): perceptrain's form, used as it is;
- any other function: a criterion ``(outputs, targets) -> loss`` (or ``(loss,
  metrics)``), marquardt-trainer 0.2's form, applied to ``model(x)`` and ``y``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ._errors import ConfigError

_CRITERIA: dict[str, Callable[[], nn.Module]] = {
    "mse": nn.MSELoss,
    "cross_entropy": nn.CrossEntropyLoss,
}


def split_batch(batch: Any) -> tuple[Any, Any]:
    """``(inputs, targets)`` of a batch: a pair, or a dict with ``x`` and ``y``."""
    if isinstance(batch, Sequence) and not isinstance(batch, str | bytes) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, dict) and "x" in batch and "y" in batch:
        return batch["x"], batch["y"]
    if batch is None:
        raise TypeError(
            "the loss needs a batch (inputs, targets) but there is no data. HINT: pass a "
            "train_dataloader, or a loss_fn(batch, model) that computes the loss from the "
            "model alone (batch is None)"
        )
    raise TypeError(
        f"expected a batch (inputs, targets) but got {type(batch).__name__}"
        f"{f' of length {len(batch)}' if isinstance(batch, Sequence) else ''}. HINT: make the "
        "dataset return (x, y) pairs, e.g. TensorDataset(x, y), or pass loss_fn(batch, model)"
    )


class CriterionLoss:
    """``(batch, model) -> (loss, metrics)`` from a criterion ``(outputs, targets)``."""

    def __init__(self, criterion: Callable[..., Any], name: str | None = None) -> None:
        self.criterion = criterion
        self.name = name or getattr(criterion, "__name__", type(criterion).__name__)

    def __call__(self, batch: Any, model: nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
        inputs, targets = split_batch(batch)
        output = self.criterion(model(inputs), targets)
        if isinstance(output, tuple):
            loss, metrics = output
            return loss, dict(metrics)
        return output, {}

    def __repr__(self) -> str:
        return f"CriterionLoss({self.name})"


def _takes_model(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s second parameter is a model (by name or annotation)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        return False
    second = positional[1]
    annotation = second.annotation
    named_module = isinstance(annotation, str) and annotation.split(".")[-1] == "Module"
    is_module = isinstance(annotation, type) and issubclass(annotation, nn.Module)
    return second.name == "model" or named_module or is_module


def resolve_loss(loss_fn: Any) -> Callable[..., Any]:
    """``loss_fn`` as ``(batch, model) -> (loss, metrics)`` (see the module's rule)."""
    if isinstance(loss_fn, CriterionLoss):
        return loss_fn
    if isinstance(loss_fn, str):
        if loss_fn not in _CRITERIA:
            raise ConfigError(
                f"Trainer(loss_fn={loss_fn!r}): unknown loss name. HINT: use one of "
                f"{', '.join(map(repr, _CRITERIA))}, or pass a function loss_fn(batch, model) "
                "-> (loss, metrics)"
            )
        return CriterionLoss(_CRITERIA[loss_fn](), loss_fn)
    if isinstance(loss_fn, nn.Module):
        return CriterionLoss(loss_fn)
    if not callable(loss_fn):
        raise ConfigError(
            f"Trainer(loss_fn={loss_fn!r}): expected a name or a function. HINT: use one of "
            f"{', '.join(map(repr, _CRITERIA))}, or a function loss_fn(batch, model) -> "
            "(loss, metrics)"
        )
    if _takes_model(loss_fn):
        return loss_fn
    return CriterionLoss(loss_fn)


def loss_and_metrics(output: Any) -> tuple[Any, dict[str, Any]]:
    """A loss function's result as ``(loss, metrics)`` (a bare loss gets no metrics)."""
    if isinstance(output, tuple):
        loss, metrics = output
        return loss, dict(metrics or {})
    return output, {}
