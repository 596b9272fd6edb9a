"""The eager attempts of one step, on floats read from the devices: `run_attempts`.

With the system assembled once, each attempt solves (A + λD) δ = g for the current λ,
moves θ ← θ − lr·δ and evaluates the trial loss. The damping rule accepts the point
(Marquardt 1963: the loss decreased; Nielsen 1999: the gain ratio ρ = actual / predicted
reduction is positive) and lowers λ, or θ is restored and λ raised for the next attempt;
the decision is ``attempt.decide``'s. A failed Cholesky factorisation, a non-finite δ and a
non-finite trial loss are rejected attempts, never errors. The loop ends on acceptance,
when λ reaches its ceiling (no damping makes progress), when a rejected attempt's predicted
decrease is itself below the rounding of the loss (more damping only shrinks it: the point
is converged to rounding), or after ``attempts`` solves; an accepted step may also meet a
stopping test (MINPACK's ftol / xtol, Moré 1978; ``_lm.stopping``). θ is always the last
accepted point afterwards. With ``accelerate`` (``_lm.geodesic``), each solved δ receives
its second-order correction before it is tried, or the attempt is rejected (the hook
returns the reason in words).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from marquardt.jacobian import Replicas

from ..._backends.base import LinearSystem, Solution, loss_prediction
from ..._backends.systems import read_values
from ..damping.base import DampingRule, reported_gain_ratio
from ..report import StepReport
from ..solve.kind import LinearSolver
from ..stopping import StopFacts, Stops
from .decide import NOISE_ULPS, decide, rejection_reason

__all__ = [
    "Attempts",
    "accepted_stop",
    "ceiling_stop",
    "finish_report",
    "run_attempts",
]


@dataclass(frozen=True)
class Attempts:
    """How a step's attempts are made: the linear solver, the rule, the scaling and the
    limits."""

    solver: LinearSolver
    rule: DampingRule
    scaling: str
    attempts: int
    learning_rate: float
    stopping: Stops
    accelerate: Callable[[Solution, float], Solution | str] | None = None


@dataclass(frozen=True)
class _Trial:
    """What one attempt learnt, read from the devices at once."""

    loss: float
    gradient_dot: float
    curvature: float
    status: float
    delta_norm: float


def _evaluate(
    solution: Solution,
    replicas: Replicas,
    lr: float,
    trial_loss: Callable[[], float | torch.Tensor],
) -> _Trial:
    """Move θ by −lr·δ and read the trial loss with the solve's own terms, in one transfer.

    δ goes from the backend's device to each replica's, never through the host. A failed
    solve (``status``) is only known once read: its δ is applied and evaluated like any
    other, then rejected, so that the solve never waits for the device.
    """
    replicas.add_(solution.delta, alpha=-lr, check=False)
    loss = trial_loss()
    values = read_values(
        [loss, solution.gradient_dot, solution.curvature, solution.status, solution.delta.norm()]
    )
    return _Trial(*values)


@dataclass
class _Loop:
    """The state of one step's attempts, what they act on (the replicas, their trial loss,
    the step's report) and the step's constants they read."""

    replicas: Replicas
    trial_loss: Callable[[], float | torch.Tensor]
    report: StepReport
    loss_after: float
    seconds_trial: float
    scale: float
    bound: float
    param_norm: float
    accepted: bool = False
    terminated: bool = False
    step_norm: float = 0.0
    seconds_solve: float = 0.0
    moved: bool = False  # θ may differ from the backup (a trial point not yet accepted)


def _solve(how: Attempts, system: LinearSystem, loop: _Loop) -> Solution | str:
    """One damped solve for the rule's λ (with its acceleration), or why it failed."""
    report = loop.report
    lam = how.rule.damping
    report.damping_used = lam
    report.attempts += 1
    t = time.perf_counter()
    solved = how.solver.solve(system, lam, how.scaling)
    loop.seconds_solve += time.perf_counter() - t
    if solved is None:
        return "cholesky failed"
    if solved.iterations is not None:
        report.cg_iterations.append(solved.iterations)
        report.cg_stops.append(solved.stop)
    if how.accelerate is None:
        return solved
    t = time.perf_counter()
    accelerated = how.accelerate(solved, lam)
    loop.seconds_trial += time.perf_counter() - t
    return accelerated


def _try(how: Attempts, solution: Solution, loop: _Loop) -> bool:
    """Evaluate the trial point of ``solution``, then keep it or restore θ (``decide``);
    returns whether the attempts end here."""
    rule, lr, report = how.rule, how.learning_rate, loop.report
    loop.moved = True
    t = time.perf_counter()
    trial = _evaluate(solution, loop.replicas, lr, loop.trial_loss)
    report.host_reads += 1
    loop.seconds_trial += time.perf_counter() - t
    failed = trial.status != 0.0 or not math.isfinite(trial.delta_norm)
    predicted = loss_prediction(trial.gradient_dot, trial.curvature, lr) * loop.scale
    actual = report.loss_before - trial.loss
    ok, rounding = decide(
        failed=failed,
        trial=trial.loss,
        actual=actual,
        predicted=predicted,
        bound=loop.bound,
        accepts=rule.accepts,
    )
    if not failed:
        report.predicted_reduction = predicted
        report.gain_ratio = reported_gain_ratio(actual, predicted)
    if ok:
        loop.moved = False
        rule.on_accept(actual, predicted)
        loop.accepted, loop.loss_after, loop.step_norm = True, trial.loss, lr * trial.delta_norm
        loop.terminated = accepted_stop(
            how.stopping, report, actual, predicted, loop.step_norm, loop.param_norm
        )
        return True
    loop.replicas.restore()
    loop.moved = False
    report.rejections.append(rejection_reason(failed, trial.status, trial.loss, actual))
    if rounding:
        facts = StopFacts(rounding=True, predicted=predicted, bound=loop.bound)
        loop.terminated = how.stopping.stop("rejected", facts, report)
        return True
    rule.on_reject()
    return False


def run_attempts(
    how: Attempts,
    system: LinearSystem,
    replicas: Replicas,
    trial_loss: Callable[[], float | torch.Tensor],
    report: StepReport,
    *,
    scale: float,
    seconds_trial: float,
) -> tuple[float, bool]:
    """Try damped steps on ``system`` until one is accepted; returns (loss, terminated).

    ``trial_loss()`` is the loss at the replicas' current parameters (NaN when not finite;
    a float or a 0-dim tensor on the device); ``scale`` converts the quadratic model's MSE
    prediction into the loss's units; ``seconds_trial`` is the trial time already spent in
    this step. ``report`` (holding ``loss_before``) receives the attempts, rejections, gain
    ratio, step norm and seconds.

    Whatever interrupts the loop (``KeyboardInterrupt`` during a trial forward, a solve or
    the update of the replicas, or any exception), every replica is back at the last
    accepted point when it propagates: a trial point is restored in a ``finally``.
    """
    rule = how.rule
    wanted = how.stopping.wants("param_norm")
    loop = _Loop(
        replicas=replicas,
        trial_loss=trial_loss,
        report=report,
        loss_after=report.loss_before,
        seconds_trial=seconds_trial,
        scale=scale,
        bound=NOISE_ULPS * torch.finfo(replicas.dtype).eps * abs(report.loss_before),
        param_norm=float(replicas.flat_params().double().norm()) if wanted else 0.0,
    )
    replicas.backup()
    try:
        for _ in range(how.attempts):
            solution = _solve(how, system, loop)
            if isinstance(solution, str):
                report.rejections.append(solution)
                rule.on_reject()
            elif _try(how, solution, loop):
                break
            if rule.at_ceiling:
                loop.terminated = ceiling_stop(how.stopping, report, rule.maximum)
                break
    finally:
        if loop.moved:
            replicas.restore()
    finish_report(report, loop.accepted, loop.loss_after, loop.step_norm)
    report.seconds_solve = loop.seconds_solve
    report.seconds_trial = loop.seconds_trial
    return loop.loss_after, loop.terminated


def accepted_stop(
    stopping: Stops,
    report: StepReport,
    actual: float,
    predicted: float,
    step_norm: float,
    param_norm: float,
) -> bool:
    """Whether an accepted attempt meets a stopping test (MINPACK's ftol or xtol, Moré
    1978); the report receives the termination and its sentence."""
    if not stopping.asks("accepted"):
        return False
    facts = StopFacts(
        loss_before=report.loss_before,
        actual=actual,
        predicted=predicted,
        step_norm=step_norm,
        param_norm=param_norm,
    )
    return stopping.stop("accepted", facts, report)


def ceiling_stop(stopping: Stops, report: StepReport, maximum: float) -> bool:
    """The step stops: λ reached its ceiling (the ``"ceiling"`` tests)."""
    facts = StopFacts(
        maximum=maximum, attempts=report.attempts, rejections=tuple(report.rejections)
    )
    return stopping.stop("ceiling", facts, report)


def finish_report(report: StepReport, accepted: bool, loss_after: float, step_norm: float) -> None:
    """The report's outcome, and its sentence when no stopping test gave one."""
    report.accepted = accepted
    report.loss_after = loss_after
    report.step_norm = step_norm
    if not report.reason:
        report.reason = (
            f"accepted after {report.attempts} attempt(s)"
            if accepted
            else f"no attempt lowered the loss in {report.attempts} attempts "
            f"({', '.join(report.rejections)}); parameters unchanged"
        )
