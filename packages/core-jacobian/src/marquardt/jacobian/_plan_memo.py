"""The last plans, kept for a batch passed again unchanged: `PlanMemo`.

A full-batch fit passes the same data every step, and a plan (its probe forward on the first
samples, the reference check of the Jacobian rule, the memory budget) depends on the
batch's shapes, the slicing and the strategy, not on the parameters' values. The batch is
recognised by weak references (the same tensors, still alive, so their memory was not
reused) and version counters (nothing wrote into them in place); anything else, a
different slicing, strategy, column count or residual function, plans anew. A few plans
are kept, the most recent first: a step that plans the same batch twice over (its
system by ``accumulate``, geodesic acceleration's slices by ``explicit``) plans each once.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from ._planner import JacobianPlan

__all__ = ["PlanMemo"]

#: Plans kept: the strategies one step may ask of the same batch, with room to spare.
KEPT = 4


@dataclass(frozen=True)
class _Entry:
    refs: tuple[weakref.ref[torch.Tensor], ...]
    versions: tuple[int, ...]
    settings: Hashable
    plan: JacobianPlan

    def holds(self, tensors: tuple[torch.Tensor, ...], settings: Hashable) -> bool:
        if settings != self.settings:
            return False
        if not all(ref() is t for ref, t in zip(self.refs, tensors, strict=True)):
            return False
        return tuple(t._version for t in tensors) == self.versions


class PlanMemo:
    """The last ``KEPT`` distinct ``(batch, settings) → plan``."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def get(
        self, inputs: torch.Tensor, targets: torch.Tensor, settings: Hashable
    ) -> JacobianPlan | None:
        """The plan made for these very tensors, unchanged, and equal ``settings``."""
        tensors = (inputs, targets)
        for entry in self._entries:
            if entry.holds(tensors, settings):
                return entry.plan
        return None

    def keep(
        self, inputs: torch.Tensor, targets: torch.Tensor, settings: Hashable, plan: JacobianPlan
    ) -> None:
        entry = _Entry(
            (weakref.ref(inputs), weakref.ref(targets)),
            (inputs._version, targets._version),
            settings,
            plan,
        )
        # Entries of other batches (their tensors gone) or the same settings make room.
        kept = [
            e
            for e in self._entries
            if e.settings != settings and all(ref() is not None for ref in e.refs)
        ]
        self._entries = [entry, *kept][:KEPT]
