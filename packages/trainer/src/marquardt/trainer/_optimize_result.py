"""``OptimizeResult``: the run's latest loss and metrics, as callbacks read them.

perceptrain's value of the same name and fields. The trainer rebuilds it at the end of
each stage (a batch, an epoch, a validation pass): ``loss`` is the mean loss of the
stage's batches and ``metrics`` their mean metrics, named ``train_*``, ``val_*`` or
``test_*`` with ``train_loss`` / ``val_loss`` / ``test_loss`` among them. ``iteration``
is the epoch (perceptrain counts callbacks' ``called_every`` in it). ``extra`` is free
for callbacks (``Callback(modify_optimize_result={...})`` writes into it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class OptimizeResult:
    """The state of an optimization at one iteration, handed to callbacks."""

    #: The epoch (or, in a batch-level stage, the global step) this result belongs to.
    iteration: int
    #: The model at that iteration.
    model: nn.Module
    #: The optimizer (a torch optimizer, an ``LMA`` or a nevergrad optimizer).
    optimizer: Any
    #: The stage's loss (mean over its batches), ``None`` before any was computed.
    loss: torch.Tensor | float | None = None
    #: The stage's metrics, prefixed ``train_`` / ``val_`` / ``test_``.
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Anything else callbacks want to pass on.
    extra: dict[str, Any] = field(default_factory=dict)
    #: The global rank of the process that built this result.
    rank: int = 0
    #: The device the result was computed on.
    device: str | torch.device | None = "cpu"
