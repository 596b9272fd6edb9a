"""A batch checked and planned once for one step: `PreparedBatch`.

One Levenberg-Marquardt step forms the products of ``J`` once and then evaluates the loss
at each trial point on the same samples (Marquardt 1963; Nielsen 1999). Everything that
depends only on the batch (its length, finiteness, the slice size, the residual rows per
sample, the plan) is settled once by ``JacobianEngine.prepare`` and reused by every call
of that step, so no call checks the data or probes the model again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._columns import ColumnSubset
from ._planner import JacobianPlan
from ._slicing import slice_ranges

__all__ = ["PreparedBatch"]


@dataclass(frozen=True)
class PreparedBatch:
    """A batch of ``samples`` samples, checked, with the plan for its step.

    Arguments:
        inputs: the batch's inputs.
        targets: the batch's targets.
        samples: the number of samples ``N``.
        plan: the Jacobian plan made for this batch.
        slice_samples: how many samples one Jacobian slice holds (the caller's
            ``slice_size``, or the plan's default).
        forward_samples: how many samples one forward-only slice holds (the same with a
            ``slice_size``, else bounded by the memory budget).
        columns: when set, the parameter subset whose columns alone the step's products
            are formed for (the plan was made for their number).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    samples: int
    plan: JacobianPlan
    slice_samples: int
    forward_samples: int
    columns: ColumnSubset | None = None

    @property
    def rows(self) -> int:
        """``R = N·m``, the residual rows of the batch."""
        return self.plan.rows

    @property
    def params(self) -> int:
        """The columns of ``J`` the products hold: ``k`` for a subset, else ``P``."""
        return self.plan.params

    @property
    def strategy(self) -> str:
        """``accumulate``, ``explicit`` or ``matrix_free``, as planned."""
        return self.plan.strategy

    def slices(self) -> list[tuple[int, int]]:
        """Sample ranges of the Jacobian slices."""
        return slice_ranges(self.samples, self.slice_samples)

    def forward_slices(self) -> list[tuple[int, int]]:
        """Sample ranges of the forward-only slices (loss, residuals)."""
        return slice_ranges(self.samples, self.forward_samples)
