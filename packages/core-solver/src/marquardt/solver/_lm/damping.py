"""Damping rules: how λ in (A + λD)δ = g moves after each attempt.

Two small, replaceable classes share the `DampingRule` protocol:

* `FixedDamping` (Marquardt 1963): accept an attempt when the loss decreases; λ is
  multiplied by ``down`` after an acceptance and by ``up`` after a rejection.
* `NielsenDamping` (Nielsen 1999; Madsen, Nielsen & Tingleff 2004, §3.2): the gain
  ratio ρ = (actual reduction) / (reduction predicted by the linear model) decides. Accept
  when ρ > 0; then λ ← λ·max(1/3, 1 − (2ρ − 1)³) and ν ← 2. On rejection λ ← λ·ν and
  ν ← 2ν, so repeated failures raise λ ever faster (the formula of ``_rules``, which the
  curve fits use too).

Both clamp λ to [minimum, maximum]; a rule *at its ceiling* (λ = maximum) means the model
cannot be improved from here, which ``LMA.step`` reports as termination ("damping_max").
λ lives in the rule and carries over from step to step, also when the batch changes.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

from .._rules import NU_START, nielsen_accept, nielsen_reject

__all__ = ["DampingRule", "FixedDamping", "NielsenDamping", "reported_gain_ratio"]

# ν doubles on every rejection; cap it so a long run of rejections cannot overflow it
# (λ reaches its ceiling long before).
_NU_MAX = 2.0**60


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


class _Clamped:
    """λ with its bounds; shared by the rules."""

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


class FixedDamping(_Clamped):
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


class NielsenDamping(_Clamped):
    """Nielsen's (1999) gain-ratio rule.

    With ρ = actual / predicted reduction (predicted by the linear model, see
    ``Solution.predicted_reduction``): accept when ρ > 0 (which needs a positive
    prediction and a loss that decreases); then λ ← λ·max(1/3, 1 − (2ρ − 1)³), ν ← 2.
    On rejection λ ← λ·ν, ν ← 2ν. λ is clamped to [minimum, maximum].

    Arguments:
        start: the first λ.
        minimum: λ's floor.
        maximum: λ's ceiling; a rule at it ends the run.
    """

    name = "nielsen"

    def __init__(self, start: float, *, minimum: float, maximum: float) -> None:
        super().__init__(start, minimum, maximum)
        self.nu = NU_START

    def accepts(self, actual: float, predicted: float) -> bool:
        rho = reported_gain_ratio(actual, predicted)
        return math.isfinite(rho) and rho > 0.0

    def on_accept(self, actual: float, predicted: float) -> None:
        rho = reported_gain_ratio(actual, predicted)
        if math.isfinite(rho):
            self.damping = self._clamp(nielsen_accept(self.damping, rho))
        self.nu = NU_START

    def on_reject(self) -> None:
        damping, nu = nielsen_reject(self.damping, self.nu)
        self.damping = self._clamp(damping)
        self.nu = min(nu, _NU_MAX)

    def state_dict(self) -> dict[str, float]:
        return {"damping": self.damping, "nu": self.nu}

    def load_state_dict(self, state: dict[str, float]) -> None:
        super().load_state_dict(state)
        self.nu = min(max(float(state.get("nu", NU_START)), NU_START), _NU_MAX)
