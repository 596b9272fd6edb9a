"""The state of M fits run by the batched driver, and what it asks of a model and of the
data: ``BatchModel``, ``BatchData``, ``BatchState`` (``InformedState`` for the Poisson
estimator) and the fits' status codes (``_curve.batched_lm.driver`` explains the loop,
``_curve.batched_lm.phases`` one iteration).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Protocol

import torch

from ... import _rules

__all__ = [
    "LAMBDA_MAX",
    "RUNNING",
    "STATUS_MESSAGES",
    "TOO_FEW_POINTS",
    "BatchData",
    "BatchModel",
    "BatchState",
    "InformedState",
    "Reduced",
]


class BatchModel(Protocol):
    """What the batched driver asks of a model of M fits (``_curve.batch.model`` builds one
    from f by ``torch.func``): ``x_per_fit`` says whether x has a leading fit axis."""

    x_per_fit: bool

    def values(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """f for every fit: (M, N)."""
        ...

    def values_and_jacobian(
        self, theta: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(f, ∂f/∂θ) for every fit: (M, N) and (M, N, P)."""
        ...


#: The status of a fit that has not stopped.
RUNNING = -9
#: λ beyond which a fit whose damped system still cannot be factorised is called singular.
LAMBDA_MAX = 1e30

#: Each fit's status: SciPy's ``least_squares`` codes 0-4, and two of Gpufit's states.
STATUS_MESSAGES = {
    **_rules.STATUS_MESSAGES,
    -1: "Singular: J has a (numerically) zero column at the solution, a parameter the data "
    "do not determine (its variances inf), or the damped normal equations could not be "
    "factorised at any damping.",
    -2: "Non-finite: f or its Jacobian is NaN or infinite at the start or at the current point.",
    -3: "Too few points: the NaN points omitted left fewer points than parameters.",
    -4: "Non-positive model: f <= 0 at a point with counts (or f < 0), where the Poisson "
    "likelihood is undefined, at the start.",
}
#: The status of a fit that ``nan_policy="omit"`` left with fewer points than parameters.
TOO_FEW_POINTS = -3


@dataclass(frozen=True)
class BatchData:
    """One chunk of fits on its device: x (shared or per fit), y, w = 1/σ (None: σ = 1),
    the mask of points kept (None: all), bounds (M × P), each fit's loss (an index into ``losses``)
    and f_scale (M,); ``free`` (M × P, None: all) marks the parameters fitted, the others
    held at p0 (their columns of J zero), and ``estimator`` names the cost
    (``_curve.batched_lm.estimators``)."""

    x: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor | None
    mask: torch.Tensor | None
    lower: torch.Tensor
    upper: torch.Tensor
    losses: tuple[str, ...]
    loss_index: torch.Tensor
    f_scale: torch.Tensor
    free: torch.Tensor | None = None
    estimator: str = "lse"

    def take(self, index: torch.Tensor, x_per_fit: bool) -> BatchData:
        """The fits ``index`` of this chunk."""
        return replace(
            self,
            x=self.x[index] if x_per_fit else self.x,
            y=self.y[index],
            w=None if self.w is None else self.w[index],
            mask=None if self.mask is None else self.mask[index],
            lower=self.lower[index],
            upper=self.upper[index],
            loss_index=self.loss_index[index],
            f_scale=self.f_scale[index],
            free=None if self.free is None else self.free[index],
        )


@dataclass(frozen=True)
class Reduced:
    """f and J at a point of every fit, reduced over its N points: r (M × N), the cost C
    (M,), J's row scales (ones for the linear loss) and the scaled r̃ (M × N); with J̃ the
    Jacobian with its rows scaled, ``gram`` J̃ᵀJ̃ (M × P × P) and ``g`` J̃ᵀr̃ (M × P)."""

    r: torch.Tensor
    cost: torch.Tensor
    rows: torch.Tensor
    rs: torch.Tensor
    gram: torch.Tensor
    g: torch.Tensor

    def reduced(self) -> dict[str, torch.Tensor]:
        """These fields by name (a ``Reduced``'s, whatever the subclass)."""
        return {f.name: getattr(self, f.name) for f in fields(Reduced)}


@dataclass(frozen=True)
class BatchState(Reduced):
    """Every fit's LM state (leading axis M): the ``Reduced`` evaluation at p (J itself is
    not kept), MINPACK's scaling d, λ and ν, the counts and the status."""

    p: torch.Tensor
    d: torch.Tensor
    lam: torch.Tensor
    nu: torch.Tensor
    nfev: torch.Tensor
    njev: torch.Tensor
    steps: torch.Tensor
    status: torch.Tensor

    def take(self, index: torch.Tensor) -> BatchState:
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def put(self, index: torch.Tensor, part: BatchState) -> BatchState:
        """This state with the fits ``index`` overwritten, in place, by ``part``'s."""
        for f in fields(self):
            getattr(self, f.name)[index] = getattr(part, f.name)
        return self


@dataclass(frozen=True)
class InformedState(BatchState):
    """A Poisson fit's state with ``info``, the Fisher information at p (M × P × P) of the
    fits that stopped on an accepted trial, NaN for the others (``estimators.informed``):
    pcov without evaluating those fits again."""

    info: torch.Tensor
