"""Marquardt's (1963) fixed factors: `FixedDamping` and its tensor form.

An attempt is accepted when the loss strictly decreases (actual reduction > 0); λ is
multiplied by ``down`` after an acceptance and by ``up`` after a rejection, clamped.
"""

from __future__ import annotations

import math

import torch

from .base import Clamped, DampingRule, Outcome, Pair, TensorRule, clamp_tensor
from .kind import DampingArgs, DampingKind

__all__ = ["KIND", "FixedDamping", "FixedTensor"]


class FixedDamping(Clamped):
    """λ ← λ·down on acceptance, λ ← λ·up on rejection, clamped (Marquardt 1963).

    An attempt is accepted when the loss strictly decreases (actual reduction > 0).

    Arguments:
        start: the first λ.
        up: the factor λ is multiplied by after a rejection (> 1).
        down: the factor λ is multiplied by after an acceptance (< 1).
        minimum: λ's floor.
        maximum: λ's ceiling; a rule at it ends the run.
    """

    name = "fixed"

    def __init__(
        self, start: float, *, up: float, down: float, minimum: float, maximum: float
    ) -> None:
        super().__init__(start, minimum, maximum)
        self.up = float(up)
        self.down = float(down)

    def accepts(self, actual: float, predicted: float) -> bool:
        return math.isfinite(actual) and actual > 0.0

    def on_accept(self, actual: float, predicted: float) -> None:
        self.damping = self._clamp(self.damping * self.down)

    def on_reject(self) -> None:
        self.damping = self._clamp(self.damping * self.up)


class FixedTensor:
    """`FixedDamping` on tensors (`TensorRule`).

    Arguments:
        up: the factor on rejection.
        down: the factor on acceptance.
        minimum: λ's floor.
        maximum: λ's ceiling.
    """

    def __init__(self, up: float, down: float, minimum: float, maximum: float) -> None:
        self.up, self.down = up, down
        self.minimum, self.maximum = minimum, maximum

    def accepts(self, actual: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        return torch.isfinite(actual) & (actual > 0.0)

    def update(self, damping: torch.Tensor, nu: torch.Tensor, outcome: Outcome) -> Pair:
        lam_accept = clamp_tensor(damping * self.down, self.minimum, self.maximum)
        lam_reject = clamp_tensor(damping * self.up, self.minimum, self.maximum)
        rejected = torch.where(outcome.rejected, lam_reject, damping)
        return torch.where(outcome.accepted, lam_accept, rejected), nu


def _tensor(rule: DampingRule) -> TensorRule:
    assert isinstance(rule, FixedDamping)
    return FixedTensor(rule.up, rule.down, rule.minimum, rule.maximum)


def _make(args: DampingArgs) -> DampingRule:
    return FixedDamping(
        args.start, up=args.up, down=args.down, minimum=args.minimum, maximum=args.maximum
    )


#: The fixed rule in the registry of damping rules.
KIND = DampingKind("fixed", FixedDamping, _make, _tensor)
