"""The decision of one attempt, written once for floats and for tensors: `decide`.

After a damped solve and a trial evaluation, with the actual reduction a = L − L(θ − lr·δ)
and the reduction p the quadratic model predicts (``_backends.base.loss_prediction``), an
attempt is

* *accepted* when the solve succeeded, the trial loss is finite, a exceeds the rounding
  of the loss (``NOISE_ULPS`` units of the parameters' epsilon, relative to L: a smaller
  decrease is noise of the loss evaluation, and counting it would let a converged run
  wander on forever) and the damping rule accepts (a, p) (Marquardt 1963: a > 0; Nielsen
  1999: ρ = a/p > 0);
* a *rounding stop* when it is not accepted, its solve succeeded and 0 ≤ p ≤ the rounding:
  more damping only shrinks p, so no attempt can pass, and the step stops instead of
  climbing to λ's ceiling one trial forward at a time;
* rejected otherwise: θ is restored and the rule moves λ up.

The eager attempts (``attempt.eager``) call `decide` on floats, the pure attempt
(``attempt.pure``, plain, compiled or captured) on 0-dim tensors; the same expression
serves both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..._backends.base import FAILED_CHOLESKY
from ..solve.cg import FAILED_CURVATURE

__all__ = ["NOISE_ULPS", "decide", "rejection_reason"]

#: A trial loss must be lower than the loss at the start of the step by more than this many
#: units of rounding (machine epsilon of the parameters' dtype, relative to the loss) to
#: count as a decrease: differences below that are rounding noise of the loss evaluation.
NOISE_ULPS = 16.0

#: A float or a 0-dim tensor.
Value = Any


def _all(*terms: Value) -> Value:
    """The conjunction of bools, or of bool tensors."""
    if isinstance(terms[0], torch.Tensor):
        out = terms[0]
        for term in terms[1:]:
            out = out & term
        return out
    return all(terms)


def _not(term: Value) -> Value:
    return ~term if isinstance(term, torch.Tensor) else not term


def _finite(value: Value) -> Value:
    return torch.isfinite(value) if isinstance(value, torch.Tensor) else math.isfinite(value)


def decide(
    *,
    failed: Value,
    trial: Value,
    actual: Value,
    predicted: Value,
    bound: Value,
    accepts: Callable[[Value, Value], Value],
) -> tuple[Value, Value]:
    """Whether the attempt is accepted, and whether it is a rounding stop.

    Arguments:
        failed: whether the solve failed (its status, or a non-finite δ).
        trial: the trial loss.
        actual: the actual reduction of the loss.
        predicted: the predicted reduction, in the loss's units.
        bound: the rounding of the loss, ``NOISE_ULPS``·ε·|L|.
        accepts: the damping rule's accept test (its tensor form for tensors).

    Returns:
        (accepted, rounding), bools for floats and bool tensors for tensors.
    """
    if not isinstance(trial, torch.Tensor) and (failed or not math.isfinite(trial)):
        # The float path asks the rule only of an evaluated, finite trial.
        accepted: Value = False
    else:
        accepted = _all(_not(failed), _finite(trial), actual > bound, accepts(actual, predicted))
    rounding = _all(_not(accepted), _not(failed), predicted >= 0.0, predicted <= bound)
    return accepted, rounding


#: What a failed solve's status means, in words (any other: "non-finite step").
_FAILURES = {
    FAILED_CHOLESKY: "cholesky failed",
    FAILED_CURVATURE: "non-positive curvature",
}


def rejection_reason(failed: bool, status: float, trial: float, actual: float) -> str:
    """Why an evaluated attempt was rejected: its failed solve, or its trial loss.

    Arguments:
        failed: whether the solve failed.
        status: the solve's status.
        trial: the trial loss.
        actual: the actual reduction.

    Returns:
        The reason, in words.
    """
    if failed:
        return _FAILURES.get(status, "non-finite step")
    if not math.isfinite(trial):
        return "non-finite loss"
    if actual > 0.0:
        return "loss did not decrease beyond rounding"
    return "loss did not decrease"
