"""``LMA``'s keywords as a few option objects, checked in one place: `lma_options`.

``LMA`` keeps cuPyLMA's flat keyword face; `lma_options` turns the keywords into the
objects the step uses, once, before anything is built: the damping rule (``damping`` and
``damping_start/up/down/min/max`` make a `NielsenDamping` or a `FixedDamping`, Marquardt
1963, Nielsen 1999), the stopping tests `Stops` (MINPACK's ftol / xtol / gtol, Moré 1978, and any registered test), the
`Scaling` of D, the `Acceleration` (Transtrum & Sethna 2012), the parameter `Subsets`,
and the matrix-free step's `TruncatedCG`. Every check raises `SolverConfigError` in the
house form and changes nothing; the checks themselves are in ``option_checks.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marquardt.jacobian import PointResidual

from .._backends.base import ArrayBackend
from .._errors import SolverConfigError, message
from .damping.base import DampingRule
from .memory_fit import check_limit
from .option_checks import (
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
    stopping_tests,
)
from .points import check_point_residual
from .robust import check_robust_loss, robust_residual_fn
from .solve import check_solver
from .solve.cg_options import TruncatedCG
from .stopping import Stops
from .subsets import ParamSelection, Selector, check_selection

__all__ = [
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
    stopping: Stops
    jacobian_mode: str
    robust: tuple[str, float] | None
    subsets: Subsets | None
    seed: int | None
    memory_limit: int | None
    process_group: object
    acceleration: Acceleration | None
    cg: TruncatedCG
    compile_attempt: str = "auto"
    linear_solver: str = "auto"

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


def _acceleration(k: Mapping[str, Any]) -> tuple[Acceleration | None, float]:
    """The geodesic acceleration (None: off) and the scaling's memory γ, checked."""
    alpha, memory = check_poor_start_options(
        k["geodesic"],
        k["scaling_memory"],
        geodesic_reject=k["geodesic_reject"],
        geodesic_after=k["geodesic_after"],
        scaling=k["scaling"],
        backend=k["backend"],
        params_per_step=k["params_per_step"],
        process_group=k["process_group"],
    )
    if alpha is None:
        return None, memory
    return Acceleration(alpha, reject=k["geodesic_reject"], after=k["geodesic_after"]), memory


def lma_options(
    model: nn.Module,
    devices: Sequence[torch.device | str],
    residual_fn: ResidualFn,
    given: Mapping[str, Any],
) -> Options:
    """Every ``LMA`` keyword checked (see ``LMA``, where they are declared, for their
    meaning), as option objects.

    Arguments:
        model: the model.
        devices: the model devices.
        residual_fn: the residual function.
        given: every other keyword of ``LMA``, by name.

    Returns:
        The checked `Options`.

    Raises:
        SolverConfigError: an argument is out of range, of the wrong kind, or cannot be
            combined with another; raised before anything is built.
    """
    k = given
    device_list = check_callables(model, devices, residual_fn, k["loss_fn"])
    lr = positive_number("learning_rate", k["learning_rate"])
    rule = damping_rule(
        k["damping"],
        k["damping_start"],
        k["damping_up"],
        k["damping_down"],
        k["damping_min"],
        k["damping_max"],
    )
    check_choices(k["scaling"], k["attempts"], k["strategy"], k["backend"], k["dtype"])
    stops = stopping_tests(k["ftol"], k["xtol"], k["gtol"], k["stopping"])
    acceleration, memory = _acceleration(k)
    truncated_cg = check_matrix_free_options(
        k["cg"],
        strategy=k["strategy"],
        params_per_step=k["params_per_step"],
        geodesic=k["geodesic"],
    )
    loss_fn = k["loss_fn"]
    check_point_residual(residual_fn, model, loss_fn=loss_fn, robust_loss=k["robust_loss"])
    robust = check_robust_loss(k["robust_loss"], k["f_scale"], loss_fn)
    size = k["params_per_step"]
    check_selection(size, k["param_selection"], k["seed"], stops.values.get("gtol"))
    check_limit(k["memory_limit"])
    if robust is not None and not isinstance(residual_fn, PointResidual):
        residual_fn = robust_residual_fn(residual_fn, *robust)
    return Options(
        devices=device_list,
        residual_fn=residual_fn,
        loss_fn=loss_fn,
        learning_rate=lr,
        rule=rule,
        scaling=Scaling(k["scaling"], memory),
        attempts=k["attempts"],
        strategy=k["strategy"],
        backend=k["backend"],
        dtype=k["dtype"],
        stopping=stops,
        jacobian_mode=k["jacobian_mode"],
        robust=robust,
        subsets=None if size is None else Subsets(size, k["param_selection"]),
        seed=k["seed"],
        memory_limit=k["memory_limit"],
        process_group=k["process_group"],
        acceleration=acceleration,
        cg=truncated_cg,
        compile_attempt=check_compile_attempt(k["compile_attempt"]),
        linear_solver=check_solver(k["linear_solver"]),
    )
