"""marquardt.solver: the Levenberg-Marquardt algorithm (``LMA``) for PyTorch models.

Each step solves (JᵀJ/N + λD)δ = Jᵀr/N (or its under-determined dual) by a float64
Cholesky factorisation on a chosen array backend (cuPyNumeric on Legate, torch, NumPy)
and moves the parameters by −learning_rate·δ when the damping rule accepts the trial
point (Marquardt 1963; Nielsen 1999; Moré 1978).

    from marquardt.solver import LMA
    lma = LMA(model, devices, residual_fn=lambda a, b: a - b)
    loss, terminated = lma.step(x, y, slice_size)
    print(lma.report)
"""

from ._backends.base import ArrayBackend, LinearSystem, Solution
from ._damping import DampingRule, FixedDamping, NielsenDamping
from ._errors import (
    BackendUnavailableError,
    SolverConfigError,
    SolverInputError,
    SolverStateError,
)
from ._lma import LMA
from ._report import StepReport
from ._stopping import StoppingCriteria
from .timing import time

__all__ = [
    "LMA",
    "ArrayBackend",
    "BackendUnavailableError",
    "DampingRule",
    "FixedDamping",
    "LinearSystem",
    "NielsenDamping",
    "Solution",
    "SolverConfigError",
    "SolverInputError",
    "SolverStateError",
    "StepReport",
    "StoppingCriteria",
    "time",
]
