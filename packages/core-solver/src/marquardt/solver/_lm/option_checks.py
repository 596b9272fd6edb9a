"""The checks of ``LMA(...)``'s arguments, one function per group of them.

``options.lma_options`` calls them, in the order of ``LMA``'s signature, and builds the
option objects from what they return; nothing else checks an ``LMA`` argument.

The damping rule's bounds come from Marquardt (1963) and Nielsen (1999): λ starts at
``damping_start`` and stays in [``damping_min``, ``damping_max``]; the fixed rule multiplies
it by ``damping_up`` > 1 on a rejected attempt and by ``damping_down`` < 1 on an accepted
one. The MINPACK tolerances (Moré 1978) ``ftol`` / ``xtol`` / ``gtol`` are ≥ 0 or None (off).
Every check raises `SolverConfigError` in the house form and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from marquardt.devices._kind import wrong_kind
from marquardt.devices._whole import require_whole
from marquardt.jacobian import PointResidual

# The strategies' one home is the planner that chooses among them.
from marquardt.jacobian._planner import STRATEGIES
from marquardt.jacobian._validate import check_residual_fn

from .._backends.base import ArrayBackend
from .._backends.choice import BACKEND_CHOICES
from .._backends.scaling import SCALINGS
from .._errors import SolverConfigError, message
from .damping import DAMPING, DampingArgs
from .damping.base import DampingRule
from .numbers import positive_number
from .solve.cg_options import TruncatedCG
from .stopping import Stops
from .stopping.criteria import StoppingCriteria

__all__ = [
    "ATTEMPT_MODES",
    "STRATEGIES",
    "LossFn",
    "ResidualFn",
    "check_callables",
    "check_choices",
    "check_compile_attempt",
    "check_matrix_free_options",
    "check_poor_start_backend",
    "check_poor_start_options",
    "damping_rule",
    "positive_number",
    "stopping_tests",
]

#: ``residual_fn(outputs, targets)``, or residuals that call the model as a function and
#: differentiate it by its inputs (``marquardt.jacobian.PointResidual``).
ResidualFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | PointResidual
LossFn = Callable[..., Any]

#: Names accepted by ``LMA(compile_attempt=...)``: the planner decides, wherever a step
#: allows it, never (``attempt.paths``).
ATTEMPT_MODES: tuple[str, ...] = ("auto", "on", "off")


def check_callables(
    model: object, devices: object, residual_fn: object, loss_fn: object
) -> list[torch.device | str]:
    """The model, the device list and the two functions; returns the devices as a list."""
    if not isinstance(model, nn.Module):
        raise wrong_kind(
            SolverConfigError,
            "LMA(model, ...) expects a torch.nn.Module",
            model,
            "wrap the function in an nn.Module whose parameters are the unknowns",
        )
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence):
        raise SolverConfigError(
            message(
                "LMA(model, devices, ...) expects a list of devices",
                f"got {devices!r}",
                "pass a list, e.g. [torch.device('cpu')] or get_available_gpus()",
            )
        )
    check_residual_fn(
        residual_fn,
        SolverConfigError,
        "LMA(..., residual_fn) expects a callable (outputs, targets) -> residuals "
        "or a marquardt.jacobian.PointResidual",
    )
    if loss_fn is not None and not callable(loss_fn):
        raise wrong_kind(
            SolverConfigError,
            "LMA(loss_fn=...) expects a callable or None",
            loss_fn,
            "pass None for the mean squared residual",
        )
    return list(devices)


def damping_rule(
    damping: object, start: object, up: object, down: object, lo: object, hi: object
) -> DampingRule:
    """The damping rule named (or given) by ``damping``, with its bounds checked."""
    start_ = positive_number("damping_start", start)
    lo_ = positive_number("damping_min", lo)
    hi_ = positive_number("damping_max", hi)
    up_ = positive_number("damping_up", up)
    down_ = positive_number("damping_down", down)
    if not lo_ <= hi_:
        raise SolverConfigError(
            message(
                "LMA expects damping_min ≤ damping_max",
                f"got damping_min={lo_:g}, damping_max={hi_:g}",
                "swap or fix the bounds",
            )
        )
    if not up_ > 1.0 or not down_ < 1.0:
        raise SolverConfigError(
            message(
                "LMA expects damping_up > 1 and damping_down < 1",
                f"got damping_up={up_:g}, damping_down={down_:g}",
                "λ must grow on rejection and shrink on acceptance, e.g. 10 and 0.1",
            )
        )
    if isinstance(damping, str):
        kind = DAMPING.get(damping)
        if kind is None:
            raise SolverConfigError(
                message(
                    f"LMA(damping={damping!r}) names a damping rule",
                    f"the known rules are {tuple(sorted(DAMPING))}",
                    "use 'fixed' or 'nielsen', or pass a DampingRule instance",
                )
            )
        return kind.make(DampingArgs(start_, up_, down_, lo_, hi_))
    if isinstance(damping, DampingRule):
        return damping
    raise wrong_kind(
        SolverConfigError,
        "LMA(damping=...) expects 'fixed', 'nielsen' or a DampingRule",
        damping,
        "pass damping='fixed'",
    )


def check_compile_attempt(mode: object) -> str:
    """``compile_attempt``, one of ``ATTEMPT_MODES``."""
    if not isinstance(mode, str) or mode not in ATTEMPT_MODES:
        raise SolverConfigError(
            message(
                f"LMA(compile_attempt={mode!r}) names how the attempts run",
                f"the known ones are {ATTEMPT_MODES}",
                "use 'auto' (the planner), 'on' (compiled on CPUs, captured on GPUs, "
                "wherever a step allows it) or 'off' (the eager attempts)",
            )
        )
    return mode


def check_choices(
    scaling: object, attempts: object, strategy: object, backend: object, dtype: object
) -> None:
    """The named choices (scaling, strategy, backend), the attempt count and the dtype."""
    if scaling not in SCALINGS:
        raise SolverConfigError(
            message(
                f"LMA(scaling={scaling!r}) names a scaling",
                f"the known ones are {SCALINGS}",
                "use 'identity' (D = I) or 'marquardt' (D = diag(JᵀJ))",
            )
        )
    require_whole(
        attempts,
        1,
        SolverConfigError,
        "LMA(attempts=...) expects an integer ≥ 1",
        "pass e.g. attempts=10",
    )
    if strategy not in STRATEGIES:
        raise SolverConfigError(
            message(
                f"LMA(strategy={strategy!r}) names a strategy",
                f"the known ones are {STRATEGIES}",
                "use 'auto', 'explicit' (J assembled), 'accumulate' (JᵀJ summed) or "
                "'matrix_free' (conjugate gradients on JᵀJv, no matrix formed)",
            )
        )
    if isinstance(backend, str) and backend not in BACKEND_CHOICES:
        raise SolverConfigError(
            message(
                f"LMA(backend={backend!r}) names a backend",
                f"the known ones are {BACKEND_CHOICES}",
                "use backend='auto'",
            )
        )
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise SolverConfigError(
            message(
                "LMA(dtype=...) expects a floating torch.dtype or None",
                f"got {dtype!r}",
                "pass torch.float32, torch.float64 or None (the parameters' dtype)",
            )
        )


def stopping_tests(ftol: object, xtol: object, gtol: object, stopping: object) -> Stops:
    """The stopping tests asked for: MINPACK's tolerances (each ≥ 0 or None: off) and the
    ``stopping`` mapping of any registered test's option by name (or a
    ``StoppingCriteria``)."""
    if isinstance(stopping, StoppingCriteria):
        stopping = stopping.values()
    if stopping is not None and not isinstance(stopping, Mapping):
        raise wrong_kind(
            SolverConfigError,
            "LMA(stopping=...) expects a mapping of stopping tests' options by name",
            stopping,
            "pass e.g. stopping={'ftol': 1e-8}",
        )
    values = dict(stopping or {})
    for name, value in (("ftol", ftol), ("xtol", xtol), ("gtol", gtol)):
        if value is not None:
            if values.get(name) is not None:
                raise SolverConfigError(
                    message(
                        f"LMA({name}=...) and LMA(stopping={{{name!r}: ...}})",
                        "both were given",
                        "pass the tolerance once",
                    )
                )
            values[name] = value
    return Stops(values)


def check_matrix_free_options(
    cg: object,
    *,
    strategy: str,
    params_per_step: object,
    geodesic: object,
) -> TruncatedCG:
    """``cg`` (None: the defaults) as a ``TruncatedCG``, refused with the options a
    matrix-free step cannot take (its system is an operator, not a matrix)."""
    if cg is not None and not isinstance(cg, TruncatedCG):
        raise wrong_kind(
            SolverConfigError,
            "LMA(cg=...) expects a marquardt.solver.TruncatedCG or None",
            cg,
            "pass e.g. cg=TruncatedCG(iterations=50, tolerance=1e-4)",
        )
    if cg is not None and strategy in ("explicit", "accumulate"):
        raise SolverConfigError(
            message(
                "LMA(cg=...) sets the conjugate gradients of the matrix-free strategy",
                f"strategy={strategy!r} factorises a matrix and never uses them",
                "pass strategy='matrix_free' (or 'auto'), or leave cg unset",
            )
        )
    if strategy == "matrix_free":
        for name, value in (("params_per_step", params_per_step), ("geodesic", geodesic)):
            if value is not None:
                raise SolverConfigError(
                    message(
                        f"LMA(strategy='matrix_free', {name}=...) was requested",
                        f"{name} needs the step's matrix, which a matrix-free step never forms",
                        f"leave {name} unset, or choose strategy='auto'",
                    )
                )
    return cg if cg is not None else TruncatedCG()


def check_poor_start_options(
    geodesic: object,
    scaling_memory: object,
    *,
    geodesic_reject: object,
    geodesic_after: object,
    scaling: str,
    backend: object,
    params_per_step: object,
    process_group: object,
) -> tuple[float | None, float]:
    """``geodesic`` (α of the geodesic acceleration, `GeodesicAcceleration`; None: off) and
    ``scaling_memory`` (γ of D_k = max(diag_k, γ·D_{k−1}), `remembered`), checked against
    the options they cannot be combined with; returns them as floats."""
    alpha = None if geodesic is None else positive_number("geodesic", geodesic)
    if not isinstance(geodesic_reject, bool) or (geodesic_reject and alpha is None):
        raise SolverConfigError(
            message(
                "LMA(geodesic_reject=...) expects True or False, with geodesic=α set for True",
                f"got geodesic_reject={geodesic_reject!r}, geodesic={geodesic!r}",
                "pass e.g. geodesic=0.75, geodesic_reject=True",
            )
        )
    require_whole(
        geodesic_after,
        0,
        SolverConfigError,
        "LMA(geodesic_after=...) expects an integer ≥ 0 (the step it starts at)",
        "pass e.g. geodesic_after=0 (from the first step)",
    )
    memory = positive_number("scaling_memory", scaling_memory, allow_zero=True)
    if memory > 1.0:
        raise SolverConfigError(
            message(
                "LMA(scaling_memory=...) expects a number in [0, 1]",
                f"got {scaling_memory!r}",
                "pass 0 (D from this step's Jacobian alone), 1 (MINPACK's running maximum) "
                "or a decay in between, e.g. 0.5",
            )
        )
    if memory > 0.0 and scaling != "marquardt":
        raise SolverConfigError(
            message(
                "LMA(scaling_memory=...) remembers Marquardt's scaling D = diag(JᵀJ)/N",
                f"scaling={scaling!r}",
                "pass scaling='marquardt', or leave scaling_memory=0",
            )
        )
    for name, value in (("geodesic", alpha), ("scaling_memory", memory or None)):
        if value is None:
            continue
        if params_per_step is not None:
            raise SolverConfigError(
                message(
                    f"LMA({name}=...) needs every step on all the parameters",
                    f"params_per_step={params_per_step!r} steps on subsets, whose columns "
                    "change from step to step",
                    f"leave {name} unset with params_per_step",
                )
            )
        if name == "geodesic" and process_group is not None:
            raise SolverConfigError(
                message(
                    "LMA(geodesic=...) evaluates its correction on one process's batch",
                    f"process_group={process_group!r} shares every step between ranks",
                    "leave geodesic unset with a process_group",
                )
            )
        if name == "geodesic" and (
            backend == "cupynumeric" or getattr(backend, "name", None) == "cupynumeric"
        ):
            raise _geodesic_on_cupynumeric()
    return alpha, memory


def check_poor_start_backend(geodesic: float | None, backend: ArrayBackend) -> None:
    """The geodesic acceleration refused on the backend ``backend="auto"`` chose, as it is
    when cuPyNumeric is named."""
    if geodesic is not None and backend.name == "cupynumeric":
        raise _geodesic_on_cupynumeric()


def _geodesic_on_cupynumeric() -> SolverConfigError:
    return SolverConfigError(
        message(
            "LMA(geodesic=...) solves its correction with the torch or NumPy backend",
            "backend='cupynumeric'",
            "pass backend='torch' (or 'numpy'), or leave geodesic unset",
        )
    )
