"""The damped attempts of one step: :func:`run_attempts`.

With the system assembled once, each attempt solves (A + λD) δ = g for the current λ,
moves θ ← θ − lr·δ and evaluates the trial loss. The damping rule accepts the point
(Marquardt 1963: the loss decreased; Nielsen 1999: the gain ratio ρ = actual / predicted
reduction is positive) and lowers λ, or θ is restored and λ raised for the next attempt.
A failed Cholesky factorisation, a non-finite δ and a non-finite trial loss are rejected
attempts, never errors. The loop ends on acceptance, when λ reaches its ceiling (no damping
makes progress), or after ``attempts`` solves; an accepted step may also meet the MINPACK
ftol / xtol tests (Moré 1978). θ is always the last accepted point afterwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ._backends.base import ArrayBackend, LinearSystem
from ._damping import DampingRule, gain_ratio
from ._report import StepReport
from ._stopping import StoppingCriteria

if TYPE_CHECKING:
    from marquardt.jacobian import Replicas

__all__ = ["NOISE_ULPS", "Attempts", "run_attempts"]

#: A trial loss must be lower than the loss at the start of the step by more than this many
#: units of rounding (machine epsilon of the parameters' dtype, relative to the loss) to
#: count as a decrease: differences below that are rounding noise of the loss evaluation.
NOISE_ULPS = 16.0


@dataclass(frozen=True)
class Attempts:
    """How a step's attempts are made: the backend, the rule, the scaling and the limits."""

    backend: ArrayBackend
    rule: DampingRule
    scaling: str
    attempts: int
    learning_rate: float
    stopping: StoppingCriteria


def _rejection(trial: float, actual: float) -> str:
    """Why a trial point that was evaluated was not accepted, in words."""
    if not math.isfinite(trial):
        return "non-finite loss"
    if actual > 0.0:
        return "loss did not decrease beyond rounding"
    return "loss did not decrease"


def run_attempts(
    how: Attempts,
    system: LinearSystem,
    replicas: Replicas,
    trial_loss: Callable[[], float],
    report: StepReport,
    *,
    scale: float,
    seconds_trial: float,
) -> tuple[float, bool]:
    """Try damped steps on ``system`` until one is accepted; returns (loss, terminated).

    ``trial_loss()`` is the loss at the replicas' current parameters (NaN when not finite);
    ``scale`` converts the quadratic model's MSE prediction into the loss's units;
    ``seconds_trial`` is the trial time already spent in this step. ``report`` (holding
    ``loss_before``) receives the attempts, rejections, gain ratio, step norm and seconds.
    """
    rule = how.rule
    lr = how.learning_rate
    stopping = how.stopping
    backend = how.backend
    loss_before = report.loss_before
    param_norm = float(replicas.flat_params().double().norm()) if stopping.xtol is not None else 0.0
    replicas.backup()
    noise = NOISE_ULPS * torch.finfo(replicas.dtype).eps
    seconds_solve = 0.0
    accepted = False
    loss_after = loss_before
    terminated = False
    last_delta_norm = 0.0
    for _ in range(how.attempts):
        lam = rule.damping
        report.damping_used = lam
        report.attempts += 1
        t = time.perf_counter()
        solution = backend.solve(system, lam, how.scaling)
        backend.synchronize()
        seconds_solve += time.perf_counter() - t
        if solution is None or not bool(torch.isfinite(solution.delta).all()):
            report.rejections.append("cholesky failed" if solution is None else "non-finite step")
            rule.on_reject()
        else:
            replicas.add_(solution.delta, alpha=-lr)
            t = time.perf_counter()
            trial = trial_loss()
            seconds_trial += time.perf_counter() - t
            predicted = solution.predicted_reduction(lr) * scale
            actual = loss_before - trial
            report.predicted_reduction = predicted
            report.gain_ratio = gain_ratio(actual, predicted)
            # A reduction below the rounding error of the loss itself is noise, not
            # progress: counting it would let a converged run wander on forever.
            significant = actual > noise * abs(loss_before)
            if math.isfinite(trial) and significant and rule.accepts(actual, predicted):
                rule.on_accept(actual, predicted)
                accepted = True
                loss_after = trial
                last_delta_norm = lr * float(solution.delta.norm())
                if stopping.ftol_met(loss_before, actual, predicted):
                    terminated, report.termination = True, "ftol"
                    report.reason = "ftol: relative reductions of the loss ≤ ftol"
                elif stopping.xtol_met(last_delta_norm, param_norm):
                    terminated, report.termination = True, "xtol"
                    report.reason = "xtol: relative change of the parameters ≤ xtol"
                break
            replicas.restore()
            report.rejections.append(_rejection(trial, actual))
            rule.on_reject()
        if rule.at_ceiling:
            terminated, report.termination = True, "damping_max"
            report.reason = (
                f"damping reached its ceiling {rule.maximum:g} without lowering the loss "
                f"({report.attempts} attempts: {', '.join(report.rejections)})"
            )
            break

    report.accepted = accepted
    report.loss_after = loss_after
    report.step_norm = last_delta_norm
    report.seconds_solve = seconds_solve
    report.seconds_trial = seconds_trial
    if not report.reason:
        report.reason = (
            f"accepted after {report.attempts} attempt(s)"
            if accepted
            else f"no attempt lowered the loss in {report.attempts} attempts "
            f"({', '.join(report.rejections)}); parameters unchanged"
        )
    return loss_after, terminated
