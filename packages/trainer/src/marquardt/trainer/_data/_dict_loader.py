"""``DictDataLoader``: several loaders read together, one batch of each per step, by name.

A batch is ``{name: batch of loader name}``. perceptrain uses it for physics-informed
networks, one loader per term (the PDE's interior points, the initial and the boundary
conditions): the model maps the dict of inputs to a dict of residuals r_k, one per name,
and the loss is the sum over the names of the criterion against zero,

    L = Σ_k criterion(r_k, 0),    metrics = {k: criterion(r_k, 0)},

so each term's loss is logged under its own name (``per_key_loss``). The loaders are
read in step; an epoch ends when the first of them runs out. Its length is the first
loader's, as perceptrain counts an epoch by the first loader (no length when that one has
none, an infinite loader: one batch per epoch then).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader


@dataclass
class DictDataLoader:
    """Holds named ``DataLoader``s; each ``next`` gives ``{name: next batch of that loader}``.

    Arguments:
        dataloaders: the loaders, by name.
    """

    dataloaders: dict[str, DataLoader[Any]]
    _iterators: dict[str, Iterator[Any]] = field(default_factory=dict, init=False, repr=False)

    def __iter__(self) -> DictDataLoader:
        self._iterators = {name: iter(loader) for name, loader in self.dataloaders.items()}
        return self

    def __len__(self) -> int:
        if not self.dataloaders:
            raise TypeError("DictDataLoader({}) has no loader, hence no length")
        return len(next(iter(self.dataloaders.values())))

    def __getstate__(self) -> dict[str, Any]:
        # Running iterators stay behind: a loader sent to another process starts afresh.
        return {"dataloaders": self.dataloaders}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.dataloaders = state["dataloaders"]
        self._iterators = {}

    def __next__(self) -> dict[str, Any]:
        if not self._iterators:
            raise TypeError(
                "DictDataLoader: next() before iter(). HINT: iterate it (for batch in loader), "
                "or call iter(loader) first"
            )
        return {name: next(iterator) for name, iterator in self._iterators.items()}


def per_key_loss(
    batch: Mapping[str, Any],
    model: nn.Module,
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The sum over the names of ``criterion(model(batch)[name], 0)``, and each term by name.

    ``model(batch)`` takes the dict batch of a ``DictDataLoader`` and returns a dict
    of residuals with the same names (perceptrain's ``PINN``). ``criterion`` defaults to
    the mean squared error.
    """
    criterion = criterion if criterion is not None else nn.MSELoss()
    outputs = model(dict(batch))
    if not isinstance(outputs, Mapping):
        raise TypeError(
            f"a DictDataLoader batch (names {sorted(batch)}) went into a model that returned "
            f"a {type(outputs).__name__}, not a dict of residuals by name. HINT: make the "
            "model return {name: residual} for the batch's names, or pass a loss_fn(batch, "
            "model) -> (loss, metrics) that reads the dict itself"
        )
    metrics = {
        name: criterion(residual, torch.zeros_like(residual)) for name, residual in outputs.items()
    }
    if not metrics:
        raise ValueError(
            "the model returned no residual for the DictDataLoader batch. HINT: return one "
            "residual tensor per name of the batch"
        )
    loss = torch.stack(list(metrics.values())).sum()
    return loss, metrics
