"""The damping rules in tensors, for attempts that never read the host: `tensor_rule`.

`NielsenDamping` and `FixedDamping` (``damping.py``) decide and update λ with Python
floats; an attempt compiled or captured as a graph needs the same decisions as tensor
``where``s. Each rule's tensor form sits in one registry by rule class, reading the
rule's own constants and the Nielsen formulas of ``_rules``; a rule without one (a user's
``DampingRule``) keeps the eager attempts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._rules import NU_START, nielsen_accept, nielsen_reject
from .damping import _NU_MAX, DampingRule, FixedDamping, NielsenDamping

__all__ = ["TensorRule", "tensor_rule"]

Tensor = torch.Tensor
Pair = tuple[Tensor, Tensor]
#: (λ on acceptance, ν on acceptance, λ on rejection, ν on rejection), before clamping.
Updates = tuple[Tensor, Tensor, Tensor, Tensor]


def _clamp(value: torch.Tensor, minimum: float, maximum: float) -> torch.Tensor:
    """λ clamped to [minimum, maximum], NaN to the maximum (``damping._Clamped``)."""
    clamped = value.clamp(minimum, maximum)
    return torch.where(torch.isnan(value), torch.full_like(value, maximum), clamped)


@dataclass(frozen=True)
class TensorRule:
    """A damping rule's accept test and update on 0-dim float64 tensors.

    Arguments:
        name: the rule's name (``"nielsen"``, ``"fixed"``).
        minimum: λ's floor.
        maximum: λ's ceiling.
        up: the fixed rule's factor on rejection.
        down: the fixed rule's factor on acceptance.
    """

    name: str
    minimum: float
    maximum: float
    up: float = 1.0
    down: float = 1.0

    def accepts(self, actual: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        """Whether the rule accepts these reductions (``DampingRule.accepts``)."""
        return _ACCEPTS[self.name](actual, predicted)

    def update(
        self,
        damping: torch.Tensor,
        nu: torch.Tensor,
        *,
        accepted: torch.Tensor,
        rejected: torch.Tensor,
        actual: torch.Tensor,
        predicted: torch.Tensor,
    ) -> Pair:
        """(λ, ν) after the attempt: the rule's ``on_accept`` where ``accepted``, its
        ``on_reject`` where ``rejected``, unchanged elsewhere."""
        lam_accept, nu_accept, lam_reject, nu_reject = _UPDATES[self.name](
            self, damping, nu, actual / predicted
        )
        lam = torch.where(
            accepted,
            _clamp(lam_accept, self.minimum, self.maximum),
            torch.where(rejected, _clamp(lam_reject, self.minimum, self.maximum), damping),
        )
        return lam, torch.where(accepted, nu_accept, torch.where(rejected, nu_reject, nu))


def _nielsen_accepts(actual: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    # ρ > 0 with a finite, positive prediction and a finite actual reduction.
    good = (predicted > 0.0) & torch.isfinite(predicted) & torch.isfinite(actual)
    return good & (actual / predicted > 0.0)


def _fixed_accepts(actual: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(actual) & (actual > 0.0)


def _nielsen_updates(rule: TensorRule, lam: Tensor, nu: Tensor, ratio: Tensor) -> Updates:
    lam_reject, nu_reject = nielsen_reject(lam, nu)
    nu_accept = torch.full_like(nu, NU_START)
    return nielsen_accept(lam, ratio), nu_accept, lam_reject, nu_reject.clamp(max=_NU_MAX)


def _fixed_updates(rule: TensorRule, lam: Tensor, nu: Tensor, ratio: Tensor) -> Updates:
    return lam * rule.down, nu, lam * rule.up, nu


_ACCEPTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "nielsen": _nielsen_accepts,
    "fixed": _fixed_accepts,
}
_UPDATES = {"nielsen": _nielsen_updates, "fixed": _fixed_updates}


def _from_nielsen(rule: DampingRule) -> TensorRule:
    return TensorRule("nielsen", rule.minimum, rule.maximum)


def _from_fixed(rule: DampingRule) -> TensorRule:
    assert isinstance(rule, FixedDamping)
    return TensorRule("fixed", rule.minimum, rule.maximum, up=rule.up, down=rule.down)


#: The rule classes with a tensor form; any other rule runs the eager attempts.
_TENSOR_FORMS: dict[type, Callable[[DampingRule], TensorRule]] = {
    NielsenDamping: _from_nielsen,
    FixedDamping: _from_fixed,
}


def tensor_rule(rule: DampingRule) -> TensorRule | None:
    """The tensor form of ``rule``, or None for a rule without one.

    Arguments:
        rule: the solver's damping rule.

    Returns:
        Its `TensorRule`, read from the rule's constants now.
    """
    make = _TENSOR_FORMS.get(type(rule))
    return None if make is None else make(rule)
