"""The damped attempts of one step, from its assembled system: `damped_step`.

The system (JᵀJ/N + λD)δ = Jᵀr/N (or its under-determined dual) is assembled once per
step and every attempt solves it with the damping rule's λ (Marquardt 1963; Nielsen
1999), by the linear solver the step's strategy chooses (``_lm.solve``): a rejected
attempt restores θ and raises λ, the Jacobian is never recomputed within a step. Before the
attempts: the stopping tests of the ``"before"`` phase (MINPACK's gtol, Moré 1978), the
remembered scaling D (`remembered`) and, from its first step on, the geodesic acceleration
(Transtrum & Sethna 2012). The loss before the step sets the scale of the quadratic model's
prediction: it is in units of the mean squared residual, and a custom ``loss_fn`` is
compared after rescaling by loss/MSE (exact when ``loss_fn`` is a positive multiple of the
MSE).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from marquardt.jacobian import ColumnSubset, JacobianEngine, PreparedBatch

from ..._backends.base import ArrayBackend, LinearSystem
from ..assembly import Assembly
from ..damping.base import DampingRule
from ..geodesic import GeodesicAcceleration
from ..options import Options
from ..report import StepReport
from ..scaling import remembered
from ..solve import SolverParts, choose_solver
from ..solve.cg import ConjugateGradients
from ..solve.kind import LinearSolver
from ..stopping import StopFacts
from ..subsets import SubsetSolver
from .eager import Attempts, run_attempts
from .fused import run_tensor_attempts
from .paths import AttemptPaths, AttemptStep

__all__ = ["StepInput", "StepOutcome", "StepTools", "damped_step"]


@dataclass(frozen=True)
class StepTools:
    """What the solver keeps across steps and every step's attempts use.

    Arguments:
        options: the solver's options.
        rule: the damping rule (holds λ; updated by the attempts).
        backend: the array backend that assembled the system.
        cg: the conjugate gradients of matrix-free steps (their state carries over).
        engine: the Jacobian engine (its replicas are moved by the attempts).
        paths: chooses the attempts' path (eager, compiled or captured).
    """

    options: Options
    rule: DampingRule
    backend: ArrayBackend
    cg: ConjugateGradients
    engine: JacobianEngine
    paths: AttemptPaths


@dataclass(frozen=True)
class StepInput:
    """What one step brings to its attempts.

    Arguments:
        built: the step's assembled system.
        batch: the step's prepared batch.
        columns: the step's parameter subset (None: every parameter).
        trial_loss: the loss at the current parameters, as a 0-dim tensor.
        diag: the remembered D of the last step (None: none).
        step: the steps taken before this one.
        strategy_reason: why the planner left the dense strategies ("" when it did not).
    """

    built: Assembly
    batch: PreparedBatch
    columns: ColumnSubset | None
    trial_loss: Callable[[], torch.Tensor]
    diag: Any
    step: int
    strategy_reason: str


class StepOutcome(NamedTuple):
    """What a step's attempts leave: the report (its seconds, ``terminated`` and λ not yet
    final), the loss at the parameters the model holds after it, whether a stopping test
    held, and the D to remember."""

    report: StepReport
    loss: float
    terminated: bool
    diag: Any


def _loss_before(options: Options, given: StepInput) -> tuple[float, float, float]:
    """(the loss at the start, its scale per unit of MSE, the seconds its forward took)."""
    system = given.built.system
    mse_before = system.rss / system.rows
    if options.loss_fn is None:
        return mse_before, 1.0, 0.0
    t = time.perf_counter()
    loss_before = float(given.trial_loss())
    seconds = time.perf_counter() - t
    # Predictions are in MSE units; a custom loss is compared after rescaling.
    ok = mse_before > 0.0 and math.isfinite(loss_before)
    return loss_before, (loss_before / mse_before if ok else 1.0), seconds


def _report(tools: StepTools, given: StepInput, solver: str, loss_before: float) -> StepReport:
    """The step's report before its attempts."""
    built, columns = given.built, given.columns
    return StepReport(
        damping=tools.rule.damping,
        damping_used=tools.rule.damping,
        attempts=0,
        accepted=False,
        loss_before=loss_before,
        loss_after=loss_before,
        strategy=built.strategy,
        strategy_reason=given.strategy_reason or given.batch.plan.reason,
        backend=solver,
        rows=built.system.rows,
        params=tools.engine.replicas.num_params,
        selected=0 if columns is None else columns.size,
        seconds_jacobian=built.seconds_jacobian,
        seconds_transfer=built.seconds_transfer,
        seconds_assembly=built.seconds_assembly,
        seconds_collective=built.seconds_collective,
    )


def _acceleration(
    tools: StepTools, given: StepInput, system: LinearSystem
) -> GeodesicAcceleration | None:
    """The step's geodesic acceleration, when it is on (never for matrix-free steps)."""
    options = tools.options
    geodesic = options.acceleration
    if geodesic is None or given.step < geodesic.after or given.built.strategy == "matrix_free":
        return None
    return GeodesicAcceleration(
        geodesic.alpha,
        reject=geodesic.reject,
        engine=tools.engine,
        batch=given.batch,
        backend=tools.backend,
        system=system,
        scaling=options.scaling.name,
        learning_rate=options.learning_rate,
    )


def damped_step(tools: StepTools, given: StepInput) -> StepOutcome:
    """The attempts of one step on its assembled system.

    Arguments:
        tools: what the solver keeps across steps.
        given: the step's system, batch and state.

    Returns:
        The `StepOutcome`.
    """
    options, replicas = tools.options, tools.engine.replicas
    kind = choose_solver(options.linear_solver, given.built.strategy)
    solver: LinearSolver = kind.make(SolverParts(tools.backend, tools.cg))
    if given.columns is not None:
        solver = SubsetSolver(solver, given.columns.index, replicas.num_params)
    loss_before, scale, seconds_trial = _loss_before(options, given)
    report = _report(tools, given, solver.name, loss_before)
    system, diag = given.built.system, given.diag
    stops = options.stopping
    if stops.asks("before") and stops.stop("before", StopFacts(loss_before, system), report):
        report.terminated = True
        return StepOutcome(report, loss_before, True, diag)
    scaling = options.scaling
    if scaling.memory > 0.0 and not system.underdetermined:
        diag = remembered(system.diag, diag, scaling.memory)
        system = dataclasses.replace(system, diag=diag)
    accelerate = _acceleration(tools, given, system)
    how = Attempts(
        solver=solver,
        rule=tools.rule,
        scaling=scaling.name,
        attempts=options.attempts,
        learning_rate=options.learning_rate,
        stopping=options.stopping,
        accelerate=accelerate,
    )
    traits = AttemptStep(
        system,
        given.batch,
        subset=given.columns is not None,
        accelerated=accelerate is not None,
        replicas=replicas,
        options=options,
        rule=tools.rule,
        scaling=scaling.name,
        fused=kind.fused,
    )
    choice = tools.paths.choose(traits)
    report.attempt_path, report.attempt_reason = choice.path, choice.reason
    if choice.runner is not None:
        loss_after, terminated = run_tensor_attempts(
            choice.runner, how, system, replicas, given.batch, report, scale=scale
        )
        report.seconds_trial += seconds_trial
    else:
        loss_after, terminated = run_attempts(
            how,
            system,
            replicas,
            given.trial_loss,
            report,
            scale=scale,
            seconds_trial=seconds_trial,
        )
    if given.built.strategy == "matrix_free":
        report.products = system.a.products.products
        report.curvature_samples = system.a.products.curvature_samples
    if report.accepted:
        solver.accept()
    return StepOutcome(report, loss_after, terminated, diag)
