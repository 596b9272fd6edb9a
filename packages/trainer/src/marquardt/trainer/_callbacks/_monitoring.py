"""``GradientMonitoring``: statistics of every parameter's gradient, written as metrics.

For each parameter ``name`` with a gradient g (the last backward pass's), the callback
writes ``name_mean``, ``name_std``, ``name_max`` and ``name_min`` (the mean, the sample
standard deviation, the largest and the smallest entry of g), perceptrain's names, at the
epoch ``trainer.opt_result.iteration``, through the run's writer (which writes on rank 0
only). Parameters without a gradient (frozen, or a gradient-free or LM run) are left out,
and nothing is written when none has one.
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import Callback, TrainingStage


def gradient_statistics(model: torch.nn.Module) -> dict[str, float]:
    """``{name_mean, name_std, name_max, name_min}`` of each parameter's gradient."""
    stats: dict[str, float] = {}
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is None:
            continue
        grad = grad.detach()
        stats[f"{name}_mean"] = grad.mean().item()
        stats[f"{name}_std"] = grad.std().item()
        stats[f"{name}_max"] = grad.max().item()
        stats[f"{name}_min"] = grad.min().item()
    return stats


class GradientMonitoring(Callback):
    """Write the gradients' mean, std, max and min per parameter (see the module's docstring).

    Arguments:
        on: the stage it runs at, as for `Callback`.
        called_every: run every that many epochs, as for `Callback`.

    Raises:
        ValueError: ``on`` is not a stage, or ``called_every`` is not a whole number >= 0.
    """

    def __init__(self, on: str | TrainingStage, called_every: int = 1) -> None:
        super().__init__(on=on, called_every=called_every)

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        stats = gradient_statistics(trainer.model)
        if stats:
            writer.write(trainer.opt_result.iteration, stats)
