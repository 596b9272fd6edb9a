"""One LM attempt as a pure function of tensors: `lm_attempt`.

From the step's assembled system, A = JᵀJ/N and g = Jᵀr/N (or JJᵀ/N and r/N with J,
under-determined), the scaling D and the current θ, λ and ν, one attempt forms the damped
matrix A + λD, factorises it (float64 Cholesky; a failed factorisation is a rejected
attempt, as on the eager path) and solves for δ, evaluates the loss at θ − lr·δ by a
functional forward of the model, and decides as the eager attempts do (``attempt.decide``:
accepted when the solve succeeded, the trial loss is finite, lower than the loss before by
more than its rounding, and the damping rule accepts the gain ratio ρ = actual / predicted
reduction; Nielsen 1999; Marquardt 1963). λ and ν follow the rule's tensor form
(``_lm.damping``); θ is ``where(accepted, θ − lr·δ, θ)``. Nothing is read back to the
host: the decision, λ and the losses are tensors, so the same function runs eagerly,
compiled by ``torch.compile`` or captured as a CUDA graph (``attempt.paths``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ..._backends.base import loss_prediction
from ..._backends.torch_backend import factor_solve
from ..damping.base import Outcome, TensorRule
from .decide import decide

__all__ = ["AttemptResult", "AttemptSpec", "lm_attempt", "trial_loss_fn"]

#: ``loss(θ, inputs, targets)``: the loss at θ on the batch, a 0-dim float64 tensor.
TrialLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class AttemptResult(NamedTuple):
    """What one attempt leaves, all tensors on the model's device.

    ``theta``: θ after the attempt (the trial point when accepted, else θ unchanged);
    ``damping`` and ``nu``: λ and ν for the next attempt or step; ``accepted``,
    ``rounding`` (rejected with a predicted decrease below the loss's rounding: the step
    stops); ``loss``: the trial loss; ``status``: the solve's status (0 good);
    ``actual``, ``predicted``: the reductions (in the loss's units); ``delta_norm``: ‖δ‖.
    """

    theta: torch.Tensor
    damping: torch.Tensor
    nu: torch.Tensor
    accepted: torch.Tensor
    rounding: torch.Tensor
    loss: torch.Tensor
    status: torch.Tensor
    actual: torch.Tensor
    predicted: torch.Tensor
    delta_norm: torch.Tensor


@dataclass(frozen=True)
class AttemptSpec:
    """The constants of a step's attempts: the loss at a point, the rule and the limits.

    Arguments:
        trial_loss: ``loss(θ, inputs, targets)`` (`trial_loss_fn`).
        rule: the damping rule's tensor form.
        learning_rate: lr of θ ← θ − lr·δ.
        noise: the relative rounding of the loss (``NOISE_ULPS`` × the parameters' eps).
        underdetermined: whether the system is the N × N one (δ = Jᵀu, D = I).
        rows: N.
    """

    trial_loss: TrialLoss
    rule: TensorRule
    learning_rate: float
    noise: float
    underdetermined: bool
    rows: int


def trial_loss_fn(
    module: nn.Module,
    param_dict: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    residual_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
) -> TrialLoss:
    """The loss at θ as the eager trial forward computes it on one forward slice:
    Σ rᵢ² / R, or ``loss_fn(outputs, targets)``, as a 0-dim float64 tensor.

    Arguments:
        module: the model.
        param_dict: θ to the module's trainable parameters by name (``Replica.param_dict``).
        residual_fn: ``residual_fn(outputs, targets)``.
        loss_fn: the custom loss, or None.

    Returns:
        ``loss(θ, inputs, targets)``.
    """

    def loss(theta: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(module, param_dict(theta), (inputs,))
        if loss_fn is not None:
            return loss_fn(out, targets).to(torch.float64).reshape(())
        res = residual_fn(out, targets)
        return res.pow(2).sum().to(torch.float64) / res.numel()

    return loss


def lm_attempt(
    spec: AttemptSpec,
    theta: torch.Tensor,
    damping: torch.Tensor,
    nu: torch.Tensor,
    loss_before: torch.Tensor,
    scale: torch.Tensor,
    a: torch.Tensor,
    g: torch.Tensor,
    d: torch.Tensor,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    jacobian: torch.Tensor | None = None,
) -> AttemptResult:
    """One damped attempt from θ with λ = ``damping``; see the module docstring.

    Arguments:
        spec: the attempts' constants.
        theta: θ, the flat trainable parameters (the model's dtype).
        damping: λ, a 0-dim float64 tensor.
        nu: the rule's ν (Nielsen; ignored by the fixed rule), 0-dim float64.
        loss_before: the loss at θ, 0-dim float64.
        scale: the loss per unit of mean squared residual (1 without a custom loss).
        a: A = JᵀJ/N (or JJᵀ/N), float64.
        g: Jᵀr/N (or r/N), float64.
        d: the scaling D (P,), float64 (unused under-determined: D = I).
        inputs: the batch's inputs.
        targets: the batch's targets.
        jacobian: J (N × P) when under-determined, else None.

    Returns:
        The `AttemptResult`.
    """
    lr = spec.learning_rate
    if spec.underdetermined:
        m = a + torch.diag(damping.expand(a.shape[0]))
    else:
        m = a + torch.diag(d * damping)
    delta, gradient_dot, curvature, status = factor_solve(
        m, a, g, jacobian=jacobian, rows=spec.rows
    )
    trial_theta = torch.add(theta, delta.to(theta.dtype), alpha=-lr)
    loss = spec.trial_loss(trial_theta, inputs, targets)
    delta_norm = delta.norm()
    predicted = loss_prediction(gradient_dot, curvature, lr) * scale
    actual = loss_before - loss
    failed = (status != 0.0) | ~torch.isfinite(delta_norm)
    accepted, rounding = decide(
        failed=failed,
        trial=loss,
        actual=actual,
        predicted=predicted,
        bound=spec.noise * loss_before.abs(),
        accepts=spec.rule.accepts,
    )
    # A rounding stop leaves λ as it was.
    outcome = Outcome(accepted, ~accepted & ~rounding, actual / predicted)
    damping_after, nu_after = spec.rule.update(damping, nu, outcome)
    return AttemptResult(
        theta=torch.where(accepted, trial_theta, theta),
        damping=damping_after,
        nu=nu_after,
        accepted=accepted,
        rounding=rounding,
        loss=loss,
        status=status,
        actual=actual,
        predicted=predicted,
        delta_norm=delta_norm,
    )
