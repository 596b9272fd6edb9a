"""``LMA``'s keywords as a few option objects, checked in one place: `lma_options`.

``LMA`` keeps cuPyLMA's flat keyword face; `lma_options` turns the keywords into the
objects the step uses, once, before anything is built: the damping rule (``damping`` and
``damping_start/up/down/min/max`` make a `NielsenDamping` or a `FixedDamping`, Marquardt
1963, Nielsen 1999), the `StoppingCriteria` (MINPACK's ftol / xtol / gtol, Moré 1978), the
`Scaling` of D, the `Acceleration` (Transtrum & Sethna 2012), the parameter `Subsets`,
and the matrix-free step's `TruncatedCG`. Every check raises `SolverConfigError` in the
house form and changes nothing; the checks themselves are in ``option_checks.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from marquardt.jacobian import PointResidual

from .._backends.base import ArrayBackend
from .._errors import SolverConfigError, message
from .damping import DampingRule
from .matrix_free import TruncatedCG
from .memory_fit import check_limit
from .option_checks import (
    DAMPING_RULES,
    STRATEGIES,
    LossFn,
    ResidualFn,
    check_callables,
    check_choices,
    check_compile_attempt,
    check_matrix_free_options,
    check_poor_start_backend,
    check_poor_start_options,
    damping_rule,
    positive_number,
    stopping_criteria,
)
from .points import check_point_residual
from .robust import check_robust_loss, robust_residual_fn
from .stopping import StoppingCriteria
from .subsets import ParamSelection, Selector, check_selection

__all__ = [
    "DAMPING_RULES",
    "STRATEGIES",
    "Acceleration",
    "LossFn",
    "Options",
    "ResidualFn",
    "Scaling",
    "Subsets",
    "check_resolved_backend",
    "lma_options",
]


@dataclass(frozen=True)
class Scaling:
    """The damping matrix D: ``name`` "marquardt" (diag(JᵀJ)/N, clamped) or "identity",
    remembered from step to step with decay ``memory`` γ ∈ [0, 1] (0: this step's alone)."""

    name: str = "marquardt"
    memory: float = 0.0


@dataclass(frozen=True)
class Acceleration:
    """Transtrum's geodesic acceleration: dropped (or, with ``reject``, the attempt rejected)
    where 2‖a‖/‖v‖ > ``alpha``; applied from step ``after`` on."""

    alpha: float
    reject: bool = False
    after: int = 0


@dataclass(frozen=True)
class Subsets:
    """Block steps on ``size`` parameters, chosen by ``selection`` ("layer", "random" or a
    function (step, P) -> indices)."""

    size: int
    selection: str | Selector = "random"


@dataclass(frozen=True)
class Options:
    """Everything ``LMA`` was asked, checked: what it holds besides the model and its state.

    ``residual_fn`` is the one the engine differentiates (with a robust loss, its IRLS
    rows); ``robust`` is (loss, f_scale) or None; ``seed`` is the subsets' seed as given
    (a process group replaces it by rank 0's).
    """

    devices: list[torch.device | str]
    residual_fn: ResidualFn
    loss_fn: LossFn | None
    learning_rate: float
    rule: DampingRule
    scaling: Scaling
    attempts: int
    strategy: str
    backend: str | ArrayBackend
    dtype: torch.dtype | None
    stopping: StoppingCriteria
    jacobian_mode: str
    robust: tuple[str, float] | None
    subsets: Subsets | None
    seed: int | None
    memory_limit: int | None
    process_group: object
    acceleration: Acceleration | None
    cg: TruncatedCG
    compile_attempt: str = "auto"

    @property
    def auto_subsets(self) -> bool:
        """Whether the planner may choose subsets itself (nothing was forced)."""
        return self.subsets is None and self.strategy == "auto"

    def check_covariance(self) -> None:
        """Refuse ``LMA.covariance`` (least squares') when a robust loss is minimised."""
        if self.robust is not None:
            raise SolverConfigError(
                message(
                    "LMA.covariance gives the least-squares covariance",
                    f"this LMA minimises the robust loss {self.robust[0]!r}",
                    "fit with curve_fit(..., loss=...), whose covariance follows SciPy's for "
                    "robust losses, or build the LMA without robust_loss",
                )
            )

    def selection(self, sizes: Sequence[int], seed: int | None) -> ParamSelection | None:
        """The forced parameter selection over tensors of ``sizes`` (None: none forced)."""
        if self.subsets is None:
            return None
        return ParamSelection(self.subsets.size, self.subsets.selection, sizes, seed)


def check_resolved_backend(acceleration: Acceleration | None, backend: ArrayBackend) -> None:
    """The geodesic acceleration refused on the backend ``backend="auto"`` chose, as it is
    when cuPyNumeric is named."""
    check_poor_start_backend(None if acceleration is None else acceleration.alpha, backend)


def lma_options(
    model: nn.Module,
    devices: Sequence[torch.device | str],
    residual_fn: ResidualFn,
    *,
    loss_fn: LossFn | None,
    learning_rate: float,
    damping: str | DampingRule,
    damping_start: float,
    damping_up: float,
    damping_down: float,
    damping_min: float,
    damping_max: float,
    scaling: str,
    attempts: int,
    strategy: str,
    backend: str | ArrayBackend,
    dtype: torch.dtype | None,
    ftol: float | None,
    xtol: float | None,
    gtol: float | None,
    jacobian_mode: str,
    robust_loss: str | None,
    f_scale: float,
    params_per_step: int | None,
    param_selection: str | Selector,
    seed: int | None,
    memory_limit: int | None,
    process_group: object,
    geodesic: float | None,
    geodesic_reject: bool,
    geodesic_after: int,
    scaling_memory: float,
    cg: TruncatedCG | None,
    compile_attempt: str = "auto",
) -> Options:
    """Every ``LMA`` keyword checked (see ``LMA`` for their meaning), as option objects.

    Raises:
        SolverConfigError: an argument is out of range, of the wrong kind, or cannot be
            combined with another; raised before anything is built.
    """
    device_list = check_callables(model, devices, residual_fn, loss_fn)
    lr = positive_number("learning_rate", learning_rate)
    rule = damping_rule(damping, damping_start, damping_up, damping_down, damping_min, damping_max)
    check_choices(scaling, attempts, strategy, backend, dtype)
    stopping = stopping_criteria(ftol, xtol, gtol)
    alpha, memory = check_poor_start_options(
        geodesic,
        scaling_memory,
        geodesic_reject=geodesic_reject,
        geodesic_after=geodesic_after,
        scaling=scaling,
        backend=backend,
        params_per_step=params_per_step,
        process_group=process_group,
    )
    truncated_cg = check_matrix_free_options(
        cg, strategy=strategy, params_per_step=params_per_step, geodesic=geodesic
    )
    check_point_residual(residual_fn, model, loss_fn=loss_fn, robust_loss=robust_loss)
    robust = check_robust_loss(robust_loss, f_scale, loss_fn)
    check_selection(params_per_step, param_selection, seed, gtol)
    check_limit(memory_limit)
    if robust is not None and not isinstance(residual_fn, PointResidual):
        residual_fn = robust_residual_fn(residual_fn, *robust)
    return Options(
        devices=device_list,
        residual_fn=residual_fn,
        loss_fn=loss_fn,
        learning_rate=lr,
        rule=rule,
        scaling=Scaling(scaling, memory),
        attempts=attempts,
        strategy=strategy,
        backend=backend,
        dtype=dtype,
        stopping=stopping,
        jacobian_mode=jacobian_mode,
        robust=robust,
        subsets=None if params_per_step is None else Subsets(params_per_step, param_selection),
        seed=seed,
        memory_limit=memory_limit,
        process_group=process_group,
        acceleration=None
        if alpha is None
        else Acceleration(alpha, reject=geodesic_reject, after=geodesic_after),
        cg=truncated_cg,
        compile_attempt=check_compile_attempt(compile_attempt),
    )
