"""The rounding stop: a rejected attempt's predicted decrease is below the loss's rounding.

More damping only shrinks the predicted decrease, so no attempt of this step can pass the
rounding test of acceptance (``attempt.decide``, which also computes the condition, in the
tensor attempt too): the point is converged to rounding. Always on.
"""

from __future__ import annotations

from .kind import StopFacts, StopKind

__all__ = ["KIND"]


def _met(value: object, facts: StopFacts) -> str | None:
    if not facts.rounding:
        return None
    return (
        f"the quadratic model predicts a decrease of {facts.predicted:.3g}, "
        f"below the rounding of the loss ({facts.bound:.3g}): no damped step can lower it"
    )


#: The rounding stop in the registry of stopping tests.
KIND = StopKind("rounding", "rejected", _met)
