"""perceptrain's data helpers: loaders over tensors, named loaders, sampled datasets.

``to_dataloader(x, y, batch_size=, infinite=)`` makes a loader of tensors;
``DictDataLoader({"pde": ..., "boundary": ...})`` reads several loaders together (each
name's loss logged apart); ``InfiniteTensorDataset``, ``R3Dataset`` and
``GenerativeIterableDataset`` are datasets without a fixed epoch; ``OptimizeResult`` is the
value callbacks read as ``trainer.opt_result``.
"""

from ._data._datasets import (
    GenerativeIterableDataset,
    InfiniteTensorDataset,
    R3Dataset,
    to_dataloader,
)
from ._data._dict_loader import DictDataLoader
from ._result import OptimizeResult

__all__ = [
    "DictDataLoader",
    "GenerativeIterableDataset",
    "InfiniteTensorDataset",
    "OptimizeResult",
    "R3Dataset",
    "to_dataloader",
]
