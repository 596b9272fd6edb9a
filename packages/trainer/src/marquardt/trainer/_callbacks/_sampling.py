"""``R3Sampling``: the callback that moves an ``R3Dataset``'s points between epochs.

At the start of every ``called_every``-th epoch it evaluates ``fitness_function(features,
model)`` on all the dataset's points and calls ``dataset.update``: the points whose
fitness is below the dataset's release threshold are redrawn, the others kept (Daw et al.
2023, arXiv:2207.02338). For a physics-informed network the fitness is typically the norm
of the equation's residual at each point, so the points gather where the residual is high.
perceptrain's callback, bound to ``train_epoch_start``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._data._datasets import R3Dataset
from ._base import Callback


class R3Sampling(Callback):
    """Update ``initial_dataset`` by R3 with ``fitness_function`` every ``called_every`` epochs.

    Bound to ``train_epoch_start``.

    Arguments:
        initial_dataset: the ``R3Dataset`` whose points are moved.
        fitness_function: ``fitness_function(features, model)``, the fitness of every point.
        verbose: print the numbers of points retained and released at each update.
        called_every: the period, in epochs.

    Raises:
        ValueError: ``called_every`` is not a whole number >= 0.
    """

    def __init__(
        self,
        initial_dataset: R3Dataset,
        fitness_function: Callable[[torch.Tensor, nn.Module], torch.Tensor],
        verbose: bool = False,
        called_every: int = 1,
    ) -> None:
        super().__init__(on="train_epoch_start", called_every=called_every)
        self.dataset = initial_dataset
        self.fitness_function = fitness_function
        self.verbose = verbose

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> None:
        fitness = self.fitness_function(self.dataset.features, trainer.model)
        self.dataset.update(fitness)
        if self.verbose:
            print(
                f"Epoch {trainer.current_epoch}; num. retained: {self.dataset.n_retained:5d}; "
                f"num. released: {self.dataset.n_released:5d}"
            )
