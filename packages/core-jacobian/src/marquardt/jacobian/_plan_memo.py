"""The last plan, kept for a batch passed again unchanged: `PlanMemo`.

A full-batch fit passes the same data every step, and a plan (its probe forward on the first
samples, the reference check of the Jacobian rule, the memory budget) depends on the
batch's shapes, the slicing and the strategy, not on the parameters' values. The batch is
recognised by weak references (the same tensors, still alive, so their memory was not
reused) and version counters (nothing wrote into them in place); anything else, a
different slicing, strategy, column count or residual function, plans anew.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable

import torch

from ._planner import JacobianPlan

__all__ = ["PlanMemo"]


class PlanMemo:
    """One remembered ``(batch, settings) → plan``."""

    def __init__(self) -> None:
        self._refs: tuple[weakref.ref[torch.Tensor], ...] = ()
        self._versions: tuple[int, ...] = ()
        self._settings: Hashable = None
        self._plan: JacobianPlan | None = None

    def get(
        self, inputs: torch.Tensor, targets: torch.Tensor, settings: Hashable
    ) -> JacobianPlan | None:
        """The plan made for these very tensors, unchanged, and equal ``settings``."""
        if self._plan is None or settings != self._settings:
            return None
        tensors = (inputs, targets)
        same = all(ref() is t for ref, t in zip(self._refs, tensors, strict=True))
        if not same or tuple(t._version for t in tensors) != self._versions:
            return None
        return self._plan

    def keep(
        self, inputs: torch.Tensor, targets: torch.Tensor, settings: Hashable, plan: JacobianPlan
    ) -> None:
        self._refs = (weakref.ref(inputs), weakref.ref(targets))
        self._versions = (inputs._version, targets._version)
        self._settings = settings
        self._plan = plan
