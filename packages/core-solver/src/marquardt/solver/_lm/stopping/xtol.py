"""MINPACK's xtol as a mean-loss test: ‖s‖ ≤ xtol·‖θ‖ after an accepted step s.

MINPACK measures both in the scaled norm ‖D·‖; here in the Euclidean norm. Not the fit
test of ``_rules`` (SciPy's scaled form, on one fit).
"""

from __future__ import annotations

from ..numbers import positive_number
from .kind import StopFacts, StopKind

__all__ = ["KIND", "xtol_met"]


def xtol_met(xtol: float, step_norm: float, param_norm: float) -> bool:
    """‖s‖ ≤ xtol·‖θ‖.

    Arguments:
        xtol: the tolerance.
        step_norm: ‖s‖.
        param_norm: ‖θ‖.

    Returns:
        Whether the test holds.
    """
    return step_norm <= xtol * param_norm


def _met(xtol: float, facts: StopFacts) -> str | None:
    if xtol_met(xtol, facts.step_norm, facts.param_norm):
        return "xtol: relative change of the parameters ≤ xtol"
    return None


#: xtol in the registry of stopping tests.
KIND = StopKind(
    "xtol",
    "accepted",
    _met,
    check=lambda v: positive_number("xtol", v, allow_zero=True),
    needs=("param_norm",),
)
