"""What the registry of damping rules holds for each rule: `DampingKind`, `DampingArgs`.

A kind names a rule, builds it from ``LMA``'s damping keywords (checked before it is
called) and, where the rule has one, gives its tensor form for the compiled and captured
attempts (``_lm.attempt.pure``). A rule without a tensor form runs the eager attempts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import DampingRule, TensorRule

__all__ = ["DampingArgs", "DampingKind"]


@dataclass(frozen=True)
class DampingArgs:
    """``LMA``'s damping keywords, checked.

    Arguments:
        start: the first λ (``damping_start``).
        up: the factor on rejection of factor rules (``damping_up`` > 1).
        down: the factor on acceptance of factor rules (``damping_down`` < 1).
        minimum: λ's floor (``damping_min``).
        maximum: λ's ceiling (``damping_max``).
    """

    start: float
    up: float
    down: float
    minimum: float
    maximum: float


@dataclass(frozen=True)
class DampingKind:
    """One damping rule as the registry holds it.

    Arguments:
        name: what ``LMA(damping=...)`` calls it.
        rule_type: the class of the rules ``make`` builds (its tensor form is found by it).
        make: the rule from the checked keywords.
        tensor: the rule's tensor form, or None (the eager attempts only).
    """

    name: str
    rule_type: type
    make: Callable[[DampingArgs], DampingRule]
    tensor: Callable[[DampingRule], TensorRule] | None = None
