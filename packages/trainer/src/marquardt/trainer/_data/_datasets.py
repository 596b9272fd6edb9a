"""perceptrain's datasets: tensors sampled forever, R3 resampling, a sampled distribution.

- ``InfiniteTensorDataset``: the rows of a few tensors (sharing their first
  dimension) in one random order, repeated without end. The order is drawn with Python's
  ``random`` at each ``iter()``, as perceptrain does, so ``random.seed`` fixes it.
- ``R3Dataset``: Retain-Resample-Release sampling (Daw et al. 2023, "Mitigating
  propagation failures in physics-informed neural networks using retain-resample-release
  (R3) sampling", arXiv:2207.02338): N points drawn from a distribution; at each update
  the points whose fitness is below a threshold are released and redrawn, the others kept.
- ``GenerativeIterableDataset``: one draw of a distribution per item, without end.
- ``to_dataloader``: a ``DataLoader`` over tensors, finite or infinite.

A loader over an infinite dataset has no end and no length: the trainer takes one batch
of it per epoch, as perceptrain does.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset


class InfiniteTensorDataset(IterableDataset[tuple[torch.Tensor, ...]]):
    """Rows of ``tensors``, one tuple per item, in a random order cycled without end.

    Arguments:
        *tensors: tensors with one row per sample (the same first dimension).

    Raises:
        ValueError: no tensor is given, or their first dimensions differ.
    """

    def __init__(self, *tensors: torch.Tensor) -> None:
        sizes = sorted({t.size(0) for t in tensors})
        if len(sizes) != 1:
            found = f"first dimensions {sizes}" if sizes else "no tensor"
            raise ValueError(
                f"InfiniteTensorDataset: got {found}; the tensors must share their first "
                "dimension. HINT: pass tensors with one row per sample, e.g. "
                "InfiniteTensorDataset(x, y) with len(x) == len(y)"
            )
        self.tensors = tensors
        self.indices = list(range(sizes[0]))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        random.shuffle(self.indices)
        order = list(self.indices)
        while True:
            for index in order:
                yield tuple(t[index] for t in self.tensors)


class R3Dataset(Dataset[torch.Tensor]):
    """``n_samples`` points of ``proba_dist``; ``update`` releases the unfit and redraws them.

    ``proba_dist(n)`` returns ``n`` samples (a tensor with ``n`` rows). A point is released
    when its fitness is below ``release_threshold`` and replaced by a fresh draw; the
    others are retained, so the points gather where the fitness (e.g. a PDE residual) is
    high.
    """

    def __init__(
        self,
        proba_dist: Callable[[int], torch.Tensor],
        n_samples: int,
        release_threshold: float = 0.1,
    ) -> None:
        if not release_threshold >= 0.0:
            raise ValueError(
                f"R3Dataset(release_threshold={release_threshold!r}): the release threshold "
                "must be non-negative. HINT: points whose fitness is below it are redrawn, e.g. 0.1"
            )
        self.proba_dist = proba_dist
        self.n_samples = n_samples
        self.release_threshold = release_threshold
        self.features = proba_dist(n_samples)
        self.n_released = 0
        self.n_retained = 0

    def __len__(self) -> int:
        return self.n_samples

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.features[index]

    def update(self, fitness_values: torch.Tensor) -> None:
        """Release the points with fitness below the threshold and draw their replacements."""
        if len(fitness_values) != self.n_samples:
            raise ValueError(
                f"R3Dataset.update: got {len(fitness_values)} fitness values for "
                f"{self.n_samples} samples. HINT: compute one fitness per point of "
                "dataset.features"
            )
        released = (fitness_values < self.release_threshold).nonzero().flatten()
        self.n_released = int(released.numel())
        self.n_retained = self.n_samples - self.n_released
        if self.n_released:
            with torch.no_grad():
                self.features[released] = self.proba_dist(self.n_released)


class GenerativeIterableDataset(IterableDataset[torch.Tensor]):
    """``proba_dist()`` once per item, without end (a batch per draw, for instance)."""

    def __init__(self, proba_dist: Callable[[], torch.Tensor]) -> None:
        self.proba_dist = proba_dist

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield self.proba_dist()


def to_dataloader(
    *tensors: torch.Tensor,
    batch_size: int = 1,
    infinite: bool = False,
    collate_fn: Callable[..., Any] | None = None,
) -> DataLoader[Any]:
    """A ``DataLoader`` of ``batch_size`` rows of ``tensors``: one pass in order, or endless.

    Arguments:
        *tensors: tensors with one row per sample.
        batch_size: rows per batch.
        infinite: false: a ``TensorDataset`` read in order (one epoch is
            ⌈N / batch_size⌉ batches); true: an ``InfiniteTensorDataset`` (random order,
            no end; perceptrain's trainer takes one batch of it per epoch).
        collate_fn: the loader's ``collate_fn`` (``None``: torch's default).

    Returns:
        The loader.

    Raises:
        ValueError: with ``infinite``, no tensor is given or their first dimensions differ.
    """
    dataset: Dataset[Any] = InfiniteTensorDataset(*tensors) if infinite else TensorDataset(*tensors)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn)
