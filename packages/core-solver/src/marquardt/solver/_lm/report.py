"""What one LM step did: the `StepReport`.

Non-convergence is a result, not an error (house style): a step that could not lower the
loss, or that stopped on a MINPACK criterion, says so here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["TERMINATION_REASONS", "StepReport"]

#: Why ``terminated`` became true (``StepReport.termination``):
#: "damping_max": λ reached its ceiling (the model cannot be improved at this point);
#: "ftol": actual and predicted relative reductions of the loss both ≤ ftol;
#: "xtol": the step is ≤ xtol relative to the parameters;
#: "gtol": the residual is orthogonal to every Jacobian column to within gtol;
#: "rounding": a rejected attempt's predicted decrease was below the loss's rounding
#: (converged to rounding: more damping could not help either).
TERMINATION_REASONS: tuple[str, ...] = ("damping_max", "ftol", "xtol", "gtol", "rounding")


@dataclass
class StepReport:
    """The record of one ``LMA.step``.

    Non-convergence is reported here, not raised. Timings are seconds.

    Arguments:
        damping: λ after the step (the value the next step starts from).
        damping_used: the λ of the last attempt.
        attempts: the damped solves tried.
        accepted: whether the parameters moved.
        loss_before: the loss on this batch at the start of the step.
        loss_after: the loss at the end of the step (``loss_before`` when nothing was
            accepted).
        terminated: whether the run should stop here.
        termination: one of ``TERMINATION_REASONS``, or ``None``.
        reason: ``termination`` as a sentence for people.
        rejections: why each rejected attempt was rejected ("cholesky failed",
            "non-finite step", "non-finite loss", "loss did not decrease").
        gain_ratio: ρ = actual / predicted reduction of the last attempt (NaN when no trial
            point was evaluated).
        predicted_reduction: the reduction the linear model predicted for the last attempt.
        step_norm: ‖s‖ of the last attempt's step.
        seconds_jacobian: the Jacobian or its normal products on the model devices.
        seconds_transfer: moving them to the solver.
        seconds_assembly: building the linear system.
        seconds_collective: the process group's all-reduce or all-gather of the products
            (0 in one process).
        seconds_solve: all damped factorisations and solves.
        seconds_trial: the trial forwards.
        seconds_total: the whole step.
        strategy: the strategy the step ran with.
        backend: the array backend that solved.
        rows: ``N``, the residual rows.
        params: ``P``, the parameters.
        selected: ``k`` for a step on a parameter subset (0: all ``P``).
        strategy_reason: why the step ran with its strategy (the planner's words).
        cg_iterations: a matrix-free step's conjugate-gradient iterations, per attempt
            (empty for the dense strategies).
        cg_stops: why each attempt's iterations stopped ("tolerance", "budget",
            "curvature" or "non-finite").
        products: a matrix-free step's products ``JᵀJv``, the warm starts' included (0 for
            the dense strategies).
        attempt_path: how the attempts ran: ``"eager"`` (one backend solve and one trial
            forward each), ``"tensor"`` (one pure tensor function, uncompiled),
            ``"compiled"`` (that function by ``torch.compile``) or ``"captured"`` (replayed
            as a CUDA graph). Off the eager path, ``seconds_solve`` holds each attempt whole
            (the solve and the trial forward in one function) and ``seconds_trial`` only
            what ran outside it.
        attempt_reason: why the attempts ran on ``attempt_path``.
        host_reads: the reads of device values by the attempts (one per evaluated attempt:
            the trial loss with the solve's terms, or the whole attempt's outcome).
        curvature_samples: the samples a matrix-free step's products ``JᵀJv`` used (its
            curvature subsample; 0 for the dense strategies).
    """

    damping: float
    damping_used: float
    attempts: int
    accepted: bool
    loss_before: float
    loss_after: float
    terminated: bool = False
    termination: str | None = None
    reason: str = ""
    rejections: list[str] = field(default_factory=list)
    gain_ratio: float = float("nan")
    predicted_reduction: float = float("nan")
    step_norm: float = 0.0
    seconds_jacobian: float = 0.0
    seconds_transfer: float = 0.0
    seconds_assembly: float = 0.0
    seconds_collective: float = 0.0
    seconds_solve: float = 0.0
    seconds_trial: float = 0.0
    seconds_total: float = 0.0
    strategy: str = ""
    backend: str = ""
    rows: int = 0
    params: int = 0
    selected: int = 0
    strategy_reason: str = ""
    cg_iterations: list[int] = field(default_factory=list)
    cg_stops: list[str] = field(default_factory=list)
    products: int = 0
    attempt_path: str = "eager"
    attempt_reason: str = ""
    host_reads: int = 0
    curvature_samples: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The report as plain Python values (for logging).

        Returns:
            Each field by name.
        """
        return asdict(self)
