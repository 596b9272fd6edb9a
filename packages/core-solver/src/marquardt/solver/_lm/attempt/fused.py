"""The attempts of one step by the pure attempt function: `run_tensor_attempts`.

The same loop as the eager attempts (``attempt.eager``: the same decision, λ updates,
stopping tests and report), but each attempt is one call of ``lm_attempt``
(``attempt.pure``), plain, compiled or captured (``attempt.paths``), that leaves
θ, λ, ν and the decision on the device. The host reads the attempt's outcome once, in one
transfer; θ is written into the model only when the attempt was accepted, so no trial
point is ever left in it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from marquardt.jacobian import PreparedBatch, Replicas

from ..._backends.base import LinearSystem
from ..._backends.scaling import scaling_diagonal_torch
from ..._backends.systems import read_values
from ..damping.base import reported_gain_ratio
from ..report import StepReport
from ..stopping import StopFacts
from .decide import NOISE_ULPS, rejection_reason
from .eager import Attempts, accepted_stop, ceiling_stop, finish_report
from .pure import AttemptResult

__all__ = ["AttemptRunner", "run_tensor_attempts"]

#: ``runner(θ, λ, ν, loss before, scale, A, g, D, inputs, targets, J)``: `lm_attempt`
#: with the step's constants bound, plain, compiled or captured.
AttemptRunner = Callable[..., AttemptResult]


def _scalar(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64).to(device, non_blocking=True)


def _read(out: AttemptResult) -> list[float]:
    """The attempt's outcome on the host, in one transfer."""
    return read_values(
        [
            out.accepted,
            out.rounding,
            out.loss,
            out.status,
            out.actual,
            out.predicted,
            out.delta_norm,
            out.damping,
            out.nu,
        ]
    )


def _arguments(
    system: LinearSystem, batch: PreparedBatch, scaling: str, device: torch.device
) -> tuple[Any, ...]:
    """The runner's arguments that every attempt of the step shares: A, g, D, the batch's
    inputs and targets on the device, and J when under-determined."""
    d = system.scale(scaling, scaling_diagonal_torch)
    jac = system.jacobian if system.underdetermined else None
    return system.a, system.g, d, batch.inputs.to(device), batch.targets.to(device), jac


def run_tensor_attempts(
    runner: AttemptRunner,
    how: Attempts,
    system: LinearSystem,
    replicas: Replicas,
    batch: PreparedBatch,
    report: StepReport,
    *,
    scale: float,
) -> tuple[float, bool]:
    """Try damped steps by ``runner`` until one is accepted; returns (loss, terminated).

    Arguments:
        runner: the attempt function (`AttemptRunner`).
        how: the step's rule, scaling and limits (``how.accelerate`` must be None).
        system: the step's assembled system, torch tensors on the model's device.
        replicas: the model's one replica.
        batch: the step's prepared batch.
        report: the step's report (holding ``loss_before``); receives what the eager
            attempts write, and ``host_reads``.
        scale: the loss per unit of mean squared residual.

    Returns:
        The loss at the parameters the model holds afterwards, and whether a stopping
        test held.
    """
    rule, stopping, loss_before = how.rule, how.stopping, report.loss_before
    device, theta = replicas[0].device, replicas[0].flat
    param_norm = float(theta.double().norm()) if stopping.wants("param_norm") else 0.0
    shared = _arguments(system, batch, how.scaling, device)
    state = rule.state_dict()
    lam, nu = _scalar(rule.damping, device), _scalar(state.get("nu", 0.0), device)
    fixed = (_scalar(loss_before, device), _scalar(scale, device))
    bound = NOISE_ULPS * torch.finfo(replicas.dtype).eps * abs(loss_before)
    accepted, terminated = False, False
    loss_after, step_norm, seconds = loss_before, 0.0, 0.0
    for _ in range(how.attempts):
        report.damping_used = rule.damping
        report.attempts += 1
        t = time.perf_counter()
        with torch.no_grad():
            out = runner(theta, lam, nu, *fixed, *shared)
        ok, rounding, trial, status, actual, predicted, norm, lam_after, nu_after = _read(out)
        seconds += time.perf_counter() - t
        report.host_reads += 1
        lam, nu = out.damping, out.nu
        rule.load_state_dict({**state, "damping": lam_after, "nu": nu_after})
        failed = status != 0.0 or not math.isfinite(norm)
        if not failed:
            report.predicted_reduction = predicted
            report.gain_ratio = reported_gain_ratio(actual, predicted)
        if ok:
            with torch.no_grad():
                theta.copy_(out.theta)
            accepted, loss_after = True, trial
            step_norm = how.learning_rate * norm
            terminated = accepted_stop(stopping, report, actual, predicted, step_norm, param_norm)
            break
        report.rejections.append(rejection_reason(failed, status, trial, actual))
        if rounding:
            facts = StopFacts(rounding=True, predicted=predicted, bound=bound)
            terminated = stopping.stop("rejected", facts, report)
            break
        if rule.at_ceiling:
            terminated = ceiling_stop(stopping, report, rule.maximum)
            break
    finish_report(report, accepted, loss_after, step_norm)
    report.seconds_solve = seconds
    return loss_after, terminated
