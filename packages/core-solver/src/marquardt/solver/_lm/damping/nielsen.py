"""Nielsen's (1999) gain-ratio rule: `NielsenDamping` and its tensor form.

With ρ = actual / predicted reduction (Madsen, Nielsen & Tingleff 2004, §3.2): accept when
ρ > 0; then λ ← λ·max(1/3, 1 − (2ρ − 1)³) and ν ← 2. On rejection λ ← λ·ν and ν ← 2ν, so
repeated failures raise λ ever faster. The formulas are those of ``_rules``, which the
curve fits use too.
"""

from __future__ import annotations

import math

import torch

from ..._rules import NU_START, nielsen_accept, nielsen_reject
from .base import (
    NU_MAX,
    Clamped,
    DampingRule,
    Outcome,
    Pair,
    TensorRule,
    clamp_tensor,
    reported_gain_ratio,
)
from .kind import DampingArgs, DampingKind

__all__ = ["KIND", "NielsenDamping", "NielsenTensor"]


class NielsenDamping(Clamped):
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
        self.nu = min(nu, NU_MAX)

    def state_dict(self) -> dict[str, float]:
        return {"damping": self.damping, "nu": self.nu}

    def load_state_dict(self, state: dict[str, float]) -> None:
        super().load_state_dict(state)
        self.nu = min(max(float(state.get("nu", NU_START)), NU_START), NU_MAX)


class NielsenTensor:
    """`NielsenDamping` on tensors (`TensorRule`).

    Arguments:
        minimum: λ's floor.
        maximum: λ's ceiling.
    """

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum, self.maximum = minimum, maximum

    def accepts(self, actual: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        # ρ > 0 with a finite, positive prediction and a finite actual reduction.
        good = (predicted > 0.0) & torch.isfinite(predicted) & torch.isfinite(actual)
        return good & (actual / predicted > 0.0)

    def update(self, damping: torch.Tensor, nu: torch.Tensor, outcome: Outcome) -> Pair:
        accepted, rejected = outcome.accepted, outcome.rejected
        lam_reject, nu_reject = nielsen_reject(damping, nu)
        lam_accept = clamp_tensor(
            nielsen_accept(damping, outcome.ratio), self.minimum, self.maximum
        )
        lam_reject = clamp_tensor(lam_reject, self.minimum, self.maximum)
        lam = torch.where(accepted, lam_accept, torch.where(rejected, lam_reject, damping))
        nu_after = torch.where(
            accepted,
            torch.full_like(nu, NU_START),
            torch.where(rejected, nu_reject.clamp(max=NU_MAX), nu),
        )
        return lam, nu_after


def _tensor(rule: DampingRule) -> TensorRule:
    return NielsenTensor(rule.minimum, rule.maximum)


def _make(args: DampingArgs) -> DampingRule:
    return NielsenDamping(args.start, minimum=args.minimum, maximum=args.maximum)


#: Nielsen's rule in the registry of damping rules.
KIND = DampingKind("nielsen", NielsenDamping, _make, _tensor)
