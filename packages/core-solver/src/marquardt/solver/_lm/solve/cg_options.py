"""The options of the matrix-free step's conjugate gradients: `TruncatedCG`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from marquardt.devices._whole import require_whole

from ..._errors import SolverConfigError, message
from .preconditioners import PRECONDITIONERS

__all__ = ["TruncatedCG"]


@dataclass(frozen=True)
class TruncatedCG:
    """Options of the matrix-free step (``LMA(strategy="matrix_free", cg=TruncatedCG(...))``).

    Arguments:
        iterations: the CG budget per attempt (products ``JᵀJv``; a warm start adds one).
        tolerance: stop when ‖g − (A + λD)x‖ ≤ tolerance·‖g‖ (relative residual).
        warm_start: x₀ = warm_start × the last accepted δ (0: always from x₀ = 0).
        probes: Hutchinson probes of diag(JᵀJ) per step (one reverse pass each); at least
            1, since the preconditioner and Marquardt's scaling use the estimate.
        preconditioner: "nystrom" (randomized Nyström of rank ``rank``) or "jacobi"
            (``solve.preconditioners``).
        rank: the Nyström sketch's rank k: k products per step, O(P·k) memory.
        curvature_samples: the samples the products JᵀJv use (``solve.curvature``): None
            (from the budget: ``iterations + rank`` products cost about two products over
            the whole batch), a float fraction in (0, 1] of the batch, or an int count.

    Raises:
        SolverConfigError: at construction, for values out of range.
    """

    iterations: int = 20
    tolerance: float = 1e-4
    warm_start: float = 0.95
    probes: int = 1
    preconditioner: str = "nystrom"
    rank: int = 16
    curvature_samples: int | float | None = None

    def __post_init__(self) -> None:
        for name in ("iterations", "probes", "rank"):
            require_whole(
                getattr(self, name),
                1,
                SolverConfigError,
                f"TruncatedCG({name}=...) expects an integer ≥ 1",
                f"pass e.g. {name}={20 if name == 'iterations' else 4}",
            )
        if self.preconditioner not in PRECONDITIONERS:
            raise SolverConfigError(
                message(
                    f"TruncatedCG(preconditioner=...) expects one of {', '.join(PRECONDITIONERS)}",
                    f"got {self.preconditioner!r}",
                    "pass preconditioner='nystrom' or 'jacobi'",
                )
            )
        sample = self.curvature_samples
        if sample is not None and (
            isinstance(sample, bool)
            or not isinstance(sample, (int, float))
            or (isinstance(sample, float) and not 0.0 < sample <= 1.0)
            or (isinstance(sample, int) and sample < 1)
        ):
            raise SolverConfigError(
                message(
                    "TruncatedCG(curvature_samples=...) expects None, a fraction in (0, 1] "
                    "or a count ≥ 1",
                    f"got {sample!r}",
                    "pass e.g. curvature_samples=0.1, or None to size it from the budget",
                )
            )
        for name, hi in (("tolerance", math.inf), ("warm_start", 1.0)):
            value = getattr(self, name)
            ok = (
                not isinstance(value, bool)
                and isinstance(value, (int, float))
                and math.isfinite(float(value))
                and 0.0 <= float(value) <= hi
                and not (name == "tolerance" and float(value) == 0.0)
            )
            if not ok:
                bound = "> 0" if name == "tolerance" else "in [0, 1]"
                raise SolverConfigError(
                    message(
                        f"TruncatedCG({name}=...) expects a finite number {bound}",
                        f"got {value!r}",
                        "pass e.g. tolerance=1e-4" if name == "tolerance" else "pass 0.95 or 0",
                    )
                )
