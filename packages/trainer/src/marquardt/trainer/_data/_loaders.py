"""Each rank's training loader: sharded by global rank (DistributedSampler), resumable mid-epoch.

A ``DataLoader`` with a plain random or sequential sampler is re-made around a
:class:`ResumableSampler` (a ``DistributedSampler`` given the *global* rank and the world
size), keeping everything else of the original loader: batch size, ``collate_fn``,
``drop_last``, workers, pinning, worker init, generator. The sampler is re-seeded by
``set_epoch`` each epoch, so each epoch has its own order, the same on every rank, and
rank ``r`` takes samples ``r, r + W, r + 2W, …`` of it; the ``W`` per-rank batches of one
step together form one global batch of ``W × batch_size`` samples of that order.

Because the order depends only on (seed, epoch), a resumed run skips the samples already
consumed in the current epoch and continues exactly where the interrupted run was.

A ``DataLoader`` over an ``IterableDataset`` (a stream: no index, no sampler) is split
item by item. With ``W`` ranks and ``n`` loader workers per rank (``n = 1`` without
workers) there are ``W·n`` slots, worker ``w`` of rank ``r`` being slot ``s = r·n + w``;
slot ``s`` takes the items ``i`` of the stream (counted from 0, in the order the dataset
yields them) with ``i mod W·n = s``, and batches them as the original loader would. The
slots are disjoint and together hold the whole stream; each reads the stream and skips
the items of the others (:class:`RankShard`). A dataset that splits itself declares it
with a method ``set_shard(rank, world_size)``: the trainer calls it once in every training
process, before the loader is iterated, and then leaves the stream alone (the dataset
splits over its loader workers itself, with ``torch.utils.data.get_worker_info()``). With
one process the loader is used as given, as plain PyTorch would.

Ranks of a stream can run out of batches at different steps (``W·n`` does not divide the
stream, or a dataset splits itself unevenly); the training loop then ends the epoch on
every rank when the first one runs out (:func:`marquardt.trainer._loops._runner.batches`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    get_worker_info,
)

from .._errors import ConfigError


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


class RankShard(IterableDataset[Any]):
    """The items ``i`` of ``dataset``'s stream with ``i mod W·n = r·n + w`` (see above)."""

    def __init__(self, dataset: Iterable[Any], rank: int, world_size: int) -> None:
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        slot = self.rank * workers + worker
        return itertools.islice(iter(self.dataset), slot, None, self.world_size * workers)


def shards_itself(dataset: Any) -> bool:
    """Whether ``dataset`` declares that it splits its stream itself (``set_shard``)."""
    return callable(getattr(dataset, "set_shard", None))


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
    loader: Iterable[Any] | None, rank: int, world_size: int, seed: int
) -> tuple[Iterable[Any] | None, ResumableSampler | None]:
    """The loader this rank iterates, and its resumable sampler (None for a stream, or a
    loader kept as given; ``None`` when there is no data)."""
    if loader is None:
        return None, None
    if not isinstance(loader, DataLoader):
        if world_size > 1:
            raise ConfigError(
                f"fit() got a {type(loader).__name__} as loader; a data-parallel run needs a "
                "torch DataLoader so each rank can take its own share of the data. HINT: wrap "
                "the data in a DataLoader (e.g. DataLoader(TensorDataset(x, y), batch_size=16))"
            )
        return loader, None
    if isinstance(loader.dataset, IterableDataset):
        if world_size == 1:
            return loader, None
        if shards_itself(loader.dataset):
            loader.dataset.set_shard(rank, world_size)  # type: ignore[attr-defined]
            return loader, None
        shard = RankShard(loader.dataset, rank, world_size)
        return DataLoader(shard, **_loader_kwargs(loader)), None
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
