"""``OptimizeResult``: what callbacks read at a stage (perceptrain's ``data.OptimizeResult``).

At the end of a training batch it holds that batch's loss and metrics; at the end of an
epoch (training or validation) their means over the epoch's batches,
L̄ = (1/B) Σ_b L_b, as perceptrain averages them (an unweighted mean over batches). Metric
names carry the phase: ``train_loss``, ``train_<metric>``, ``val_loss``, ``test_<metric>``.
``iteration`` is the epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: One batch's loss and metrics, as a loss function returns them.
LossMetrics = tuple[Any, dict[str, Any]]


@dataclass
class OptimizeResult:
    """The run at ``iteration`` (the epoch): model, optimizer, loss, metrics, ``extra``.

    Arguments:
        iteration: the epoch.
        model: the model being trained.
        optimizer: the optimizer.
        loss: the batch's loss, or the epoch's mean loss (``None`` before any).
        metrics: the batch's or the epoch's metrics, named with their phase
            (``train_loss``, ``val_<metric>``, ...).
        extra: anything a callback's ``modify_optimize_result`` adds.
        rank: the global rank of this process.
        device: the device this process trains on.
    """

    iteration: int
    model: Any
    optimizer: Any
    loss: torch.Tensor | float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    device: str | None = "cpu"


def detached(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def with_phase(phase: str, loss: Any, metrics: dict[str, Any]) -> LossMetrics:
    """``(loss, {phase_<name>: value, ..., phase_loss: loss})``, detached."""
    named = {f"{phase}_{key}": detached(value) for key, value in metrics.items()}
    named[f"{phase}_loss"] = detached(loss)
    return detached(loss), named


def epoch_mean(results: Sequence[LossMetrics]) -> LossMetrics | tuple[None, dict[str, Any]]:
    """The mean loss and metrics over an epoch's batches (``None`` and ``{}`` if none)."""
    if not results:
        return None, {}
    loss = torch.stack([torch.as_tensor(loss, dtype=torch.float64) for loss, _ in results])
    keys = results[0][1].keys()
    metrics = {
        key: torch.stack([torch.as_tensor(m[key], dtype=torch.float64) for _, m in results]).mean()
        for key in keys
    }
    return loss.mean(), metrics
