"""What every damping rule shares: the `DampingRule` protocol, its tensor form
`TensorRule`, the bounds of λ (`Clamped`) and the gain ratio the report keeps.

A rule decides whether an attempt is accepted and moves λ in (A + λD)δ = g after it
(Marquardt 1963; Nielsen 1999). Every rule clamps λ to [minimum, maximum]; a rule *at its
ceiling* (λ = maximum) means the model cannot be improved from here, which ``LMA.step``
reports as termination ("damping_max"). λ lives in the rule and carries over from step to
step, also when the batch changes. A rule may also have a tensor form (`TensorRule`): the
same decision and update as tensor ``where``s, for attempts that never read the host
(``_lm.attempt.pure``).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol, runtime_checkable

import torch

__all__ = [
    "NU_MAX",
    "Clamped",
    "DampingRule",
    "Outcome",
    "Pair",
    "TensorRule",
    "clamp_tensor",
    "reported_gain_ratio",
]

# ν doubles on every rejection; cap it so a long run of rejections cannot overflow it
# (λ reaches its ceiling long before).
NU_MAX = 2.0**60


def reported_gain_ratio(actual: float, predicted: float) -> float:
    """ρ = actual / predicted reduction as `LMA`'s report keeps it: NaN when the prediction
    is not positive (``_rules.gain_ratio``, SciPy's reading for the fits, gives ±1 there)."""
    if not (predicted > 0.0) or not math.isfinite(predicted) or not math.isfinite(actual):
        return float("nan")
    return actual / predicted


@runtime_checkable
class DampingRule(Protocol):
    """The interface ``LMA`` drives: current λ, the accept test and the two updates.

    Attributes:
        name: the rule's name in reports (``"fixed"``, ``"nielsen"``).
        damping: the current λ.
        minimum: λ's floor.
        maximum: λ's ceiling; a rule at it ends the run (``"damping_max"``).
    """

    name: str
    damping: float
    minimum: float
    maximum: float

    def accepts(self, actual: float, predicted: float) -> bool:
        """Whether an attempt with these actual and predicted loss reductions is accepted.

        Arguments:
            actual: the loss before the attempt less the loss after it.
            predicted: the reduction the linear model predicted.

        Returns:
            True to keep the attempt.
        """
        ...

    def on_accept(self, actual: float, predicted: float) -> None:
        """Update λ after an accepted attempt.

        Arguments:
            actual: the loss reduction the attempt achieved.
            predicted: the reduction the linear model predicted.
        """
        ...

    def on_reject(self) -> None:
        """Update λ after a rejected attempt (including a failed solve)."""
        ...

    @property
    def at_ceiling(self) -> bool:
        """Whether λ has reached ``maximum``."""
        ...

    def state_dict(self) -> dict[str, float]:
        """The rule's mutable state.

        Returns:
            λ (``"damping"``) and any internal factor, by name.
        """
        ...

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore what ``state_dict`` returned.

        Arguments:
            state: a ``state_dict`` of this rule.
        """
        ...


class Clamped:
    """λ with its bounds, the part every rule shares.

    Arguments:
        start: the first λ.
        minimum: λ's floor.
        maximum: λ's ceiling.
    """

    name = "clamped"

    def __init__(self, start: float, minimum: float, maximum: float) -> None:
        self.minimum = float(minimum)
        self.maximum = float(maximum)
        self.damping = self._clamp(float(start))

    def _clamp(self, value: float) -> float:
        if math.isnan(value):
            return self.maximum
        return min(max(value, self.minimum), self.maximum)

    @property
    def at_ceiling(self) -> bool:
        return self.damping >= self.maximum

    def state_dict(self) -> dict[str, float]:
        return {"damping": self.damping}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.damping = self._clamp(float(state["damping"]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(damping={self.damping:.3g})"


#: (λ, ν) as 0-dim tensors.
Pair = tuple[torch.Tensor, torch.Tensor]


class Outcome(NamedTuple):
    """An attempt's decision as a rule's tensor form reads it: ``accepted``, ``rejected``
    (neither: the step stopped on rounding) and the gain ratio ``ratio`` = actual /
    predicted reduction."""

    accepted: torch.Tensor
    rejected: torch.Tensor
    ratio: torch.Tensor


def clamp_tensor(value: torch.Tensor, minimum: float, maximum: float) -> torch.Tensor:
    """λ clamped to [minimum, maximum], NaN to the maximum, as `Clamped` does.

    Arguments:
        value: λ, a tensor.
        minimum: λ's floor.
        maximum: λ's ceiling.

    Returns:
        The clamped λ.
    """
    clamped = value.clamp(minimum, maximum)
    return torch.where(torch.isnan(value), torch.full_like(value, maximum), clamped)


@runtime_checkable
class TensorRule(Protocol):
    """A damping rule's accept test and update on 0-dim float64 tensors: the same decisions
    as its `DampingRule`, for an attempt that leaves them on the device."""

    def accepts(self, actual: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        """Whether the rule accepts these reductions (``DampingRule.accepts``).

        Arguments:
            actual: the actual reduction of the loss.
            predicted: the predicted reduction.

        Returns:
            A 0-dim bool tensor.
        """
        ...

    def update(self, damping: torch.Tensor, nu: torch.Tensor, outcome: Outcome) -> Pair:
        """(λ, ν) after the attempt: the rule's ``on_accept`` where ``outcome.accepted``,
        its ``on_reject`` where ``outcome.rejected``, unchanged elsewhere, clamped.

        Arguments:
            damping: λ.
            nu: the rule's second state value (ν of Nielsen's rule; others keep it).
            outcome: the attempt's decision and gain ratio.

        Returns:
            (λ, ν) for the next attempt.
        """
        ...
