"""The training loader in a data-parallel run: sharded by global rank, resumable mid-epoch.

A ``DataLoader`` with a plain random or sequential sampler is re-made around a
:class:`ResumableSampler` (a ``DistributedSampler`` given the *global* rank and the world
size), keeping everything else of the original loader: batch size, ``collate_fn``,
``drop_last``, workers, pinning, worker init, generator. The sampler is re-seeded by
``set_epoch`` each epoch, so each epoch has its own order, the same on every rank, and
rank ``r`` takes samples ``r, r + W, r + 2W, …`` of it; the ``W`` per-rank batches of one
step together form one global batch of ``W × batch_size`` samples of that order.

Because the order depends only on (seed, epoch), a resumed run skips the samples already
consumed in the current epoch and continues exactly where the interrupted run was.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from ._errors import ConfigError


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` whose next pass can start ``skip`` samples in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._skip = 0

    def skip_next(self, samples: int) -> None:
        self._skip = max(0, samples)

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())
        skip, self._skip = self._skip, 0
        return iter(indices[skip:])

    def __len__(self) -> int:
        return max(0, self.num_samples - self._skip)


def _loader_kwargs(loader: DataLoader[Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "drop_last": loader.drop_last,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs


def prepare_loader(
    loader: Iterable[Any], rank: int, world_size: int, seed: int
) -> tuple[Iterable[Any], ResumableSampler | None]:
    """The loader this rank iterates, and its resumable sampler (None if kept as given)."""
    if not isinstance(loader, DataLoader):
        if world_size > 1:
            raise ConfigError(
                f"fit() got a {type(loader).__name__} as loader; a data-parallel run needs a "
                "torch DataLoader so each rank can take its own share of the data. HINT: wrap "
                "the data in a DataLoader (e.g. DataLoader(TensorDataset(x, y), batch_size=16))"
            )
        return loader, None
    if isinstance(loader.dataset, IterableDataset):
        return loader, None  # an iterable dataset shards itself (get_worker_info / rank)
    sampler = loader.sampler
    custom_batches = loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler
    if isinstance(sampler, DistributedSampler):
        shuffle, seed = bool(sampler.shuffle), int(sampler.seed)
    elif (
        type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None
    ):
        shuffle = True
    elif type(sampler) is SequentialSampler:
        shuffle = False
    else:
        custom_batches = True
    if custom_batches:
        if world_size > 1:
            raise ConfigError(
                f"the training loader uses a custom sampler ({type(sampler).__name__}) or batch "
                f"sampler ({type(loader.batch_sampler).__name__}), which cannot be split over "
                f"{world_size} ranks automatically. HINT: give the DataLoader a "
                "DistributedSampler yourself, or use shuffle=True/False with a batch_size"
            )
        return loader, None
    resumable = ResumableSampler(
        loader.dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=False,
    )
    return DataLoader(loader.dataset, sampler=resumable, **_loader_kwargs(loader)), resumable
