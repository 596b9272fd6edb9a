"""The damped attempts of one step, from its assembled system: `damped_step`.

The system (JᵀJ/N + λD)δ = Jᵀr/N (or its under-determined dual) is assembled once per
step and every attempt solves it with the damping rule's λ (Marquardt 1963; Nielsen
1999): a rejected attempt restores θ and raises λ, the Jacobian is never recomputed within
a step. Before the attempts: MINPACK's gtol test (Moré 1978), the remembered scaling D
(`remembered`) and, from its first step on, the geodesic acceleration (Transtrum & Sethna
2012). The loss before the step sets the scale of the quadratic model's prediction: it is
in units of the mean squared residual, and a custom ``loss_fn`` is compared after
rescaling by loss/MSE (exact when ``loss_fn`` is a positive multiple of the MSE).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from marquardt.jacobian import ColumnSubset, JacobianEngine, PreparedBatch, Replicas

from ..._backends.base import ArrayBackend
from ..assembly import Assembly
from ..damping.base import DampingRule
from ..geodesic import GeodesicAcceleration
from ..matrix_free import ConjugateGradients
from ..options import Options
from ..report import StepReport
from ..scaling import remembered
from ..stopping import StopFacts
from ..subsets import SubsetBackend
from .eager import Attempts, run_attempts
from .fused import run_tensor_attempts
from .paths import AttemptPaths

__all__ = ["damped_step"]


def damped_step(
    built: Assembly,
    batch: PreparedBatch,
    columns: ColumnSubset | None,
    *,
    options: Options,
    rule: DampingRule,
    backend: ArrayBackend,
    cg_solver: ConjugateGradients,
    engine: JacobianEngine,
    trial_loss: Callable[[], torch.Tensor],
    diag: Any,
    step: int,
    strategy_reason: str,
    paths: AttemptPaths,
) -> tuple[StepReport, float, bool, Any]:
    """The attempts of one step on the assembled system ``built``.

    Arguments:
        built: the step's assembled system.
        batch: the step's prepared batch.
        columns: the step's parameter subset (None: every parameter).
        options: the solver's options.
        rule: the damping rule (holds λ; updated by the attempts).
        backend: the array backend that solves dense systems.
        cg_solver: the conjugate gradients that solve matrix-free ones.
        engine: the Jacobian engine (its replicas are moved by the attempts).
        trial_loss: the loss at the current parameters, as a 0-dim tensor.
        diag: the remembered D of the last step (None: none).
        step: the steps taken before this one.
        strategy_reason: why the planner left the dense strategies ("" when it did not).
        paths: chooses the attempts' path (eager, compiled or captured).

    Returns:
        The step's report (its seconds, ``terminated`` and λ not yet final), the loss at
        the parameters the model holds after it, whether a stopping test held, and the D
        to remember.
    """
    replicas: Replicas = engine.replicas
    matrix_free = built.strategy == "matrix_free"
    solver: ArrayBackend = cg_solver if matrix_free else backend
    system = built.system
    n = system.rows
    mse_before = system.rss / n
    seconds_trial = 0.0
    if options.loss_fn is None:
        loss_before = mse_before
    else:
        t = time.perf_counter()
        loss_before = float(trial_loss())
        seconds_trial += time.perf_counter() - t
    # Predictions are in MSE units; a custom loss is compared after rescaling.
    scale = loss_before / mse_before if mse_before > 0.0 and math.isfinite(loss_before) else 1.0
    params = replicas.num_params
    report = StepReport(
        damping=rule.damping,
        damping_used=rule.damping,
        attempts=0,
        accepted=False,
        loss_before=loss_before,
        loss_after=loss_before,
        strategy=built.strategy,
        strategy_reason=strategy_reason or batch.plan.reason,
        backend=solver.name,
        rows=n,
        params=params,
        selected=0 if columns is None else columns.size,
        seconds_jacobian=built.seconds_jacobian,
        seconds_transfer=built.seconds_transfer,
        seconds_assembly=built.seconds_assembly,
        seconds_collective=built.seconds_collective,
    )
    stopping, scaling = options.stopping, options.scaling
    if stopping.stop("before", StopFacts(loss_before=loss_before, system=system), report):
        report.terminated = True
        return report, loss_before, True, diag
    if scaling.memory > 0.0 and not system.underdetermined:
        diag = remembered(system.diag, diag, scaling.memory)
        system = dataclasses.replace(system, diag=diag)
    geodesic = options.acceleration
    accelerate = (
        None
        if geodesic is None or step < geodesic.after or matrix_free
        else GeodesicAcceleration(
            geodesic.alpha,
            reject=geodesic.reject,
            engine=engine,
            batch=batch,
            backend=backend,
            system=system,
            scaling=scaling.name,
            replicas=replicas,
            learning_rate=options.learning_rate,
        )
    )
    how = Attempts(
        backend=solver if columns is None else SubsetBackend(solver, columns.index, params),
        rule=rule,
        scaling=scaling.name,
        attempts=options.attempts,
        learning_rate=options.learning_rate,
        stopping=stopping,
        accelerate=accelerate,
    )
    choice = paths.choose(
        system,
        batch,
        subset=columns is not None,
        accelerated=accelerate is not None,
        replicas=replicas,
        options=options,
        rule=rule,
        scaling=scaling.name,
    )
    report.attempt_path, report.attempt_reason = choice.path, choice.reason
    if choice.runner is not None:
        loss_after, terminated = run_tensor_attempts(
            choice.runner, how, system, replicas, batch, report, scale=scale
        )
        report.seconds_trial += seconds_trial
    else:
        loss_after, terminated = run_attempts(
            how, system, replicas, trial_loss, report, scale=scale, seconds_trial=seconds_trial
        )
    if matrix_free:
        report.products = system.a.products.products
        report.curvature_samples = system.a.products.curvature_samples
        if report.accepted:
            cg_solver.accept()
    return report, loss_after, terminated, diag
