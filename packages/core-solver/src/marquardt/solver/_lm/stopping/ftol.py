"""MINPACK's ftol as a mean-loss test (Moré, Garbow & Hillstrom 1980, lmder).

After an accepted step with actual reduction a and predicted reduction p of L = ‖r‖²/N:
a/L ≤ ftol and p/L ≤ ftol and ρ = a/p ≤ 2, both relative reductions at most ftol. Not the
fit test of ``_rules`` (SciPy's, on the cost of one fit).
"""

from __future__ import annotations

import math

from ..numbers import positive_number
from .kind import StopFacts, StopKind

__all__ = ["KIND", "ftol_met"]


def ftol_met(ftol: float, loss_before: float, actual: float, predicted: float) -> bool:
    """Relative actual and predicted reductions both ≤ ftol (and ρ ≤ 2).

    Arguments:
        ftol: the tolerance.
        loss_before: the loss L at the start of the step.
        actual: the step's actual reduction of the loss.
        predicted: the reduction the linear model predicted.

    Returns:
        Whether the test holds.
    """
    if not (loss_before > 0.0):
        return False
    if not (math.isfinite(actual) and math.isfinite(predicted)):
        return False
    rho_ok = predicted > 0.0 and actual <= 2.0 * predicted
    return abs(actual) <= ftol * loss_before and predicted <= ftol * loss_before and rho_ok


def _met(ftol: float, facts: StopFacts) -> str | None:
    if ftol_met(ftol, facts.loss_before, facts.actual, facts.predicted):
        return "ftol: relative reductions of the loss ≤ ftol"
    return None


#: ftol in the registry of stopping tests.
KIND = StopKind(
    "ftol", "accepted", _met, check=lambda v: positive_number("ftol", v, allow_zero=True)
)
