"""The ceiling stop ("damping_max"): λ reached its ceiling without lowering the loss.

The damping rule holds λ in [minimum, maximum]; at the maximum no damped step lowers the
loss from this point (Marquardt 1963). Always on.
"""

from __future__ import annotations

from .kind import StopFacts, StopKind

__all__ = ["KIND"]


def _met(value: object, facts: StopFacts) -> str | None:
    return (
        f"damping reached its ceiling {facts.maximum:g} without lowering the loss "
        f"({facts.attempts} attempts: {', '.join(facts.rejections)})"
    )


#: The ceiling stop in the registry of stopping tests.
KIND = StopKind("damping_max", "ceiling", _met)
