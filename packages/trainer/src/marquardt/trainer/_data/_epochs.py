"""How many batches perceptrain's trainer takes from a loader in one epoch.

perceptrain counts the epoch of a loader over a ``TensorDataset`` as ⌈N / batch_size⌉
batches (at most ``max_batches``); any other dataset, an infinite one in particular, as
one batch; no loader (a model that computes its own loss) as one step with no batch. A
``DictDataLoader`` counts by its first loader. The count is taken from the whole dataset,
before it is split over processes.
"""

from __future__ import annotations

import math
from typing import Any

from torch.utils.data import TensorDataset

from ._dict_loader import DictDataLoader


def batches_per_epoch(loader: Any, max_batches: int | None = None) -> int:
    """The batches one epoch takes from ``loader`` (``None``: one step without data)."""
    if loader is None:
        return 1
    if isinstance(loader, DictDataLoader):
        if not loader.dataloaders:
            raise ValueError(
                "DictDataLoader({}): no loader to read. HINT: DictDataLoader({'name': loader})"
            )
        loader = next(iter(loader.dataloaders.values()))
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, TensorDataset):
        return 1
    batch_size = loader.batch_size or 1
    count = math.ceil(dataset.tensors[0].size(0) / batch_size)
    return count if max_batches is None else min(max_batches, count)
