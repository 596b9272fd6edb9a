"""The training loader of a data-parallel run: global-rank shards, kept settings, resumption,
and streams (IterableDataset) split item by item over ranks and loader workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    TensorDataset,
    WeightedRandomSampler,
)

from marquardt.trainer import ConfigError
from marquardt.trainer._data._loaders import (
    RankShard,
    ResumableSampler,
    prepare_loader,
    shards_itself,
)


def _dataset(n: int = 20) -> TensorDataset:
    return TensorDataset(torch.arange(n).float().unsqueeze(1), torch.zeros(n, 1))


def _collate(batch: list[Any]) -> Any:
    return torch.utils.data.default_collate(batch)


def _indices(loader: Any) -> list[int]:
    return [int(v) for x, _ in loader for v in x.reshape(-1)]


def test_the_remade_loader_keeps_the_original_settings() -> None:
    loader = DataLoader(
        _dataset(),
        batch_size=3,
        shuffle=True,
        drop_last=True,
        collate_fn=_collate,
        num_workers=0,
        pin_memory=False,
    )
    remade, sampler = prepare_loader(loader, rank=1, world_size=2, seed=7)
    assert isinstance(remade, DataLoader) and isinstance(sampler, ResumableSampler)
    assert (remade.batch_size, remade.drop_last, remade.collate_fn) == (3, True, _collate)
    assert remade.num_workers == 0
    assert (sampler.rank, sampler.num_replicas, sampler.shuffle, sampler.seed) == (1, 2, True, 7)


def test_ranks_take_disjoint_shares_covering_the_data_and_epochs_differ() -> None:
    loader = DataLoader(_dataset(), batch_size=2, shuffle=True)
    shares = []
    for rank in (0, 1):
        remade, sampler = prepare_loader(loader, rank=rank, world_size=2, seed=3)
        assert sampler is not None
        sampler.set_epoch(0)
        shares.append(_indices(remade))
    assert sorted(shares[0] + shares[1]) == list(range(20))
    remade, sampler = prepare_loader(loader, rank=0, world_size=2, seed=3)
    assert sampler is not None
    sampler.set_epoch(1)
    assert _indices(remade) != shares[0]  # set_epoch reshuffles


def test_sequential_loader_keeps_its_order_and_can_resume_mid_epoch() -> None:
    loader = DataLoader(_dataset(), batch_size=4)
    remade, sampler = prepare_loader(loader, rank=0, world_size=1, seed=0)
    assert sampler is not None and _indices(remade) == list(range(20))
    sampler.skip_next(8)
    assert _indices(remade) == list(range(8, 20))
    assert _indices(remade) == list(range(20))  # the skip applies to one pass only


def test_a_distributed_sampler_with_the_wrong_rank_is_rebuilt() -> None:
    wrong = DistributedSampler(_dataset(), num_replicas=2, rank=0, shuffle=False)
    loader = DataLoader(_dataset(), batch_size=2, sampler=wrong)
    remade, sampler = prepare_loader(loader, rank=1, world_size=2, seed=0)
    assert sampler is not None and sampler.rank == 1
    assert _indices(remade) == list(range(1, 20, 2))


def test_custom_samplers_cannot_be_split_automatically() -> None:
    weighted = WeightedRandomSampler([1.0] * 20, num_samples=20)
    loader = DataLoader(_dataset(), batch_size=2, sampler=weighted)
    with pytest.raises(ConfigError, match=r"custom sampler \(WeightedRandomSampler\).*HINT"):
        prepare_loader(loader, rank=0, world_size=2, seed=0)
    assert prepare_loader(loader, rank=0, world_size=1, seed=0) == (loader, None)


def test_a_plain_iterable_needs_a_dataloader_to_be_split() -> None:
    batches = [(torch.zeros(2, 1), torch.zeros(2, 1))]
    with pytest.raises(ConfigError, match="needs a torch DataLoader"):
        prepare_loader(batches, rank=0, world_size=2, seed=0)
    assert prepare_loader(batches, rank=0, world_size=1, seed=0) == (batches, None)


class _Stream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, items: int) -> None:
        self.items = items

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.items):
            yield torch.tensor([float(i)]), torch.zeros(1)


class _SplitsItself(_Stream):
    def __init__(self, items: int) -> None:
        super().__init__(items)
        self.shard: tuple[int, int] | None = None

    def set_shard(self, rank: int, world_size: int) -> None:
        self.shard = (rank, world_size)


def test_a_stream_is_split_item_by_item_over_ranks() -> None:
    loader = DataLoader(_Stream(11), batch_size=2, collate_fn=_collate)
    shares = []
    for rank in (0, 1, 2):
        remade, sampler = prepare_loader(loader, rank=rank, world_size=3, seed=0)
        assert sampler is None and isinstance(remade, DataLoader)
        assert isinstance(remade.dataset, RankShard)
        assert (remade.batch_size, remade.collate_fn) == (2, _collate)
        shares.append(_indices(remade))
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]


def test_rank_shard_splits_over_loader_workers_too() -> None:
    # 2 ranks x 2 workers = 4 slots: worker w of rank r takes the items i = 2r + w (mod 4).
    loader = DataLoader(RankShard(_Stream(22), rank=1, world_size=2), batch_size=3, num_workers=2)
    items = _indices(loader)
    assert sorted(items) == [i for i in range(22) if i % 4 in (2, 3)]


def test_a_stream_that_splits_itself_is_told_its_rank_and_left_alone() -> None:
    dataset = _SplitsItself(10)
    loader = DataLoader(dataset, batch_size=2)
    assert shards_itself(dataset) and not shards_itself(_Stream(1))
    assert prepare_loader(loader, rank=1, world_size=4, seed=0) == (loader, None)
    assert dataset.shard == (1, 4)


def test_a_stream_in_one_process_is_used_as_given() -> None:
    dataset = _SplitsItself(10)
    loader = DataLoader(dataset, batch_size=2)
    assert prepare_loader(loader, rank=0, world_size=1, seed=0) == (loader, None)
    assert dataset.shard is None
    assert _indices(loader) == list(range(10))
