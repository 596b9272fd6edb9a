"""Where a run's data comes from: loaders, datasets with loader settings, or dataset factories.

The three levels of control of a data-parallel run:

1. **Loaders** (``fit(train_loader, val_loader)``): each rank re-makes the training loader
   around a ``DistributedSampler`` of its global rank (``_loaders``). In a spawn the
   loaders are pickled to every process.
2. **Datasets and loader settings** (``fit(train_dataset=ds, batch_size=32,
   num_workers=1)``): each rank builds its own ``DataLoader`` over ``ds`` with a
   ``DistributedSampler`` (``shuffle`` decides the sampler's order); the validation
   dataset gets a plain loader, validated whole on every rank. In a spawn the datasets
   are pickled to every process.
3. **Dataset factories** (``fit(train_dataset=make_dataset, batch_size=32)``): a callable
   taking no argument that returns the dataset, called inside each training process, after
   it joined the process group (so it may read its rank). Nothing of the data is pickled:
   only the callable travels to a spawned process (by reference, so it must be defined at
   module level), and under torchrun or srun nothing travels at all. The dataset each rank
   builds stays in that rank.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from marquardt.devices._whole import is_whole

from .._errors import ConfigError


def _is_dataset(value: Any) -> bool:
    return isinstance(value, Dataset | IterableDataset) or (
        hasattr(value, "__getitem__") and hasattr(value, "__len__")
    )


def _check_source(name: str, value: Any) -> None:
    """A dataset, or a callable taking no argument (a factory)."""
    if value is None or _is_dataset(value):
        return
    if not callable(value):
        raise ConfigError(
            f"fit({name}=...): expected a Dataset or a function returning one, got "
            f"{type(value).__name__}. HINT: e.g. fit({name}=TensorDataset(x, y), batch_size=32)"
        )
    try:
        required = [
            p
            for p in inspect.signature(value).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return
    if required:
        raise ConfigError(
            f"fit({name}=...): a dataset factory is called with no argument, but "
            f"{getattr(value, '__name__', value)!r} needs {', '.join(p.name for p in required)}. "
            "HINT: bind them first, e.g. functools.partial(make_dataset, size=1000)"
        )


def _check_loader(name: str, loader: Any) -> None:
    if loader is None:
        return
    if not isinstance(loader, Iterable):
        raise ConfigError(
            f"fit({name}=...): expected a DataLoader or an iterable of "
            f"batches, got {type(loader).__name__}. HINT: wrap the data in a DataLoader, "
            "e.g. DataLoader(TensorDataset(x, y), batch_size=16), or pass "
            "train_dataset=... with batch_size=..."
        )
    try:
        size = len(loader)  # type: ignore[arg-type]
    except TypeError:
        return
    if size == 0:
        raise ConfigError(
            f"fit({name}=...): the loader yields no batches (len 0). HINT: check the "
            "dataset is not empty and that drop_last=True does not drop its only batch"
        )


@dataclass
class DataSource:
    """A run's training and validation data as given to ``fit`` (picklable for a spawn)."""

    train: Any
    val: Any = None
    #: None: ``train``/``val`` are loaders (level 1); else the settings of the loaders to build.
    batch_size: int | None = None
    num_workers: int = 0
    shuffle: bool = True
    drop_last: bool = False

    @classmethod
    def from_fit(
        cls,
        train_loader: Any,
        val_loader: Any,
        train_dataset: Any,
        val_dataset: Any,
        batch_size: int | None,
        num_workers: int,
        shuffle: bool,
        drop_last: bool,
    ) -> DataSource:
        """Check ``fit``'s arguments (before any work) and keep them."""
        if train_dataset is None:
            if val_dataset is not None or batch_size is not None:
                raise ConfigError(
                    "fit(): loader settings (batch_size, val_dataset) go with train_dataset, "
                    "not with a train_loader. HINT: pass either loaders or datasets"
                )
            _check_loader("train_loader", train_loader)
            _check_loader("val_loader", val_loader)
            return cls(train_loader, val_loader)
        if train_loader is not None or val_loader is not None:
            raise ConfigError(
                "fit(): got both loaders and train_dataset. HINT: pass either loaders "
                "(fit(train_loader, val_loader)) or datasets (fit(train_dataset=..., "
                "val_dataset=..., batch_size=...))"
            )
        if not is_whole(batch_size, 1):
            raise ConfigError(
                f"fit(train_dataset=..., batch_size={batch_size!r}): a whole number >= 1 is "
                "needed to build the loaders. HINT: e.g. batch_size=32 (per process)"
            )
        if not is_whole(num_workers, 0):
            raise ConfigError(
                f"fit(num_workers={num_workers!r}): a whole number >= 0. HINT: 0 loads in the "
                "training process"
            )
        _check_source("train_dataset", train_dataset)
        _check_source("val_dataset", val_dataset)
        return cls(train_dataset, val_dataset, batch_size, num_workers, bool(shuffle), drop_last)

    @property
    def from_datasets(self) -> bool:
        return self.batch_size is not None

    def loaders(self) -> tuple[Any, Any]:
        """The training and validation loaders, built here (factories are called here)."""
        if not self.from_datasets:
            return self.train, self.val
        train = self._materialise("train_dataset", self.train)
        val = self._materialise("val_dataset", self.val)
        streaming = isinstance(train, IterableDataset)
        train_loader = DataLoader(
            train,
            batch_size=self.batch_size,
            shuffle=self.shuffle and not streaming,
            num_workers=self.num_workers,
            drop_last=self.drop_last,
        )
        _check_loader("train_dataset", train_loader)
        val_loader = None
        if val is not None:
            val_loader = DataLoader(val, batch_size=self.batch_size, num_workers=self.num_workers)
        return train_loader, val_loader

    @staticmethod
    def _materialise(name: str, source: Any) -> Any:
        if source is None or _is_dataset(source):
            return source
        factory: Callable[[], Any] = source
        dataset = factory()
        if not _is_dataset(dataset):
            raise ConfigError(
                f"fit({name}=...): the factory {getattr(factory, '__name__', factory)!r} "
                f"returned a {type(dataset).__name__}, not a dataset. HINT: return a "
                "torch.utils.data.Dataset (e.g. TensorDataset(x, y))"
            )
        return dataset
