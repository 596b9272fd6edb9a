"""A chosen set of parameter columns: `ColumnSubset`.

A block-coordinate Levenberg-Marquardt step (the "parameter selection" of large-model LM
trainers; Nocedal & Wright, ch. 9 on coordinate descent) updates only ``k`` of the ``P``
parameters, ``θ_S ← θ_S − δ_S``, with ``δ_S`` solving the damped system of ``J_S``, the
``k`` columns of ``J`` in ``S``. Only those columns are ever formed: the engine
differentiates with respect to the parameter tensors that ``S`` touches (and, for the
layer rules, evaluates exactly the ``k`` entries of their per-sample outer products), so
a chunk of ``b`` samples costs ``b·m·k`` numbers of ``J``, never ``b·m·P``.

The subset is kept as sorted flat indices into ``θ`` (the order of ``Replicas.names``),
and split per parameter tensor: for tensor ``t``, the local indices it contributes and
the positions (columns of ``J_S``) they land in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._errors import message

__all__ = ["ColumnSubset", "TensorColumns"]


@dataclass(frozen=True)
class TensorColumns:
    """The columns of one parameter tensor (position ``tensor`` in the flat order):
    ``local`` indices into that tensor's flattened entries, landing at ``positions``
    of ``J_S``."""

    tensor: int
    local: torch.Tensor
    positions: torch.Tensor


@dataclass(frozen=True)
class ColumnSubset:
    """``k`` distinct flat parameter indices out of ``params``, split per parameter tensor.

    Built by ``ColumnSubset.of``, which checks the indices.

    Arguments:
        index: the ``k`` flat indices into ``θ``, sorted, int64, on the CPU.
        params: ``P``, the number of parameters.
        parts: for each parameter tensor the subset touches, its local indices and the
            columns of ``J_S`` they land in.
    """

    index: torch.Tensor
    params: int
    parts: tuple[TensorColumns, ...]

    @property
    def size(self) -> int:
        """``k``, the number of columns."""
        return int(self.index.numel())

    @property
    def tensors(self) -> tuple[int, ...]:
        """The positions of the parameter tensors the subset touches."""
        return tuple(p.tensor for p in self.parts)

    @classmethod
    def of(cls, indices: torch.Tensor | Sequence[int], sizes: Sequence[int]) -> ColumnSubset:
        """The subset of flat ``indices`` for tensors of ``sizes`` (checked: integers,
        in range, distinct, at least one)."""
        params = int(sum(sizes))
        index = torch.as_tensor(indices).reshape(-1)
        if index.numel() == 0 or index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ValueError(
                message(
                    "a set of parameter columns was expected (integer flat indices)",
                    f"got {index.numel()} values of dtype {index.dtype}",
                    f"pass at least one integer index in [0, {params})",
                )
            )
        index = index.to(device="cpu", dtype=torch.int64)
        low, high = int(index.min()), int(index.max())
        if low < 0 or high >= params:
            raise ValueError(
                message(
                    f"parameter columns in [0, {params}) were expected",
                    f"got indices from {low} to {high}",
                    "index the flat parameter vector (the order of Replicas.names)",
                )
            )
        index = torch.sort(index).values
        if index.numel() > 1 and bool((index[1:] == index[:-1]).any()):
            raise ValueError(
                message(
                    "distinct parameter columns were expected",
                    f"{int((index[1:] == index[:-1]).sum())} indices are repeated",
                    "pass each column once (e.g. torch.unique(indices))",
                )
            )
        parts: list[TensorColumns] = []
        offset = 0
        for t, size in enumerate(sizes):
            lo = int(torch.searchsorted(index, offset))
            hi = int(torch.searchsorted(index, offset + size))
            if hi > lo:
                parts.append(
                    TensorColumns(t, index[lo:hi] - offset, torch.arange(lo, hi, dtype=torch.int64))
                )
            offset += size
        return cls(index=index, params=params, parts=tuple(parts))
