"""The damping rules, one module each, and their registry: `DAMPING`, `register_damping`,
`tensor_rule`.

A rule's module holds the rule (a `DampingRule`: its accept test and λ's move), its tensor
form where it has one, and its `DampingKind`; adding a rule is one new module and one line
of `DAMPING` below (or `register_damping` at run time). ``LMA(damping=name)`` and the
attempt paths read this registry and nothing else.
"""

from __future__ import annotations

from ..registry import Registry
from . import fixed, nielsen
from .base import DampingRule, TensorRule
from .kind import DampingArgs, DampingKind

__all__ = ["DAMPING", "DampingArgs", "DampingKind", "register_damping", "tensor_rule"]

#: The damping rules by name.
DAMPING: Registry[DampingKind] = Registry(fixed.KIND, nielsen.KIND)


def register_damping(kind: DampingKind) -> None:
    """Add a damping rule to the registry (or replace the one of that name).

    Arguments:
        kind: the rule's `DampingKind`.
    """
    DAMPING.add(kind)


def tensor_rule(rule: DampingRule) -> TensorRule | None:
    """The tensor form of ``rule``, or None for a rule without one.

    Arguments:
        rule: the solver's damping rule.

    Returns:
        Its `TensorRule`, read from the rule's constants now.
    """
    for kind in DAMPING.values():
        if type(rule) is kind.rule_type and kind.tensor is not None:
            return kind.tensor(rule)
    return None
