"""marquardt.solver: the Levenberg-Marquardt algorithm (``LMA``) for PyTorch models.

Each step solves (JᵀJ/N + λD)δ = Jᵀr/N (or its under-determined dual) by a float64
Cholesky factorisation on a chosen array backend (cuPyNumeric on Legate, torch, NumPy)
and moves the parameters by −learning_rate·δ when the damping rule accepts the trial
point (Marquardt 1963; Nielsen 1999; Moré 1978).

    from marquardt.solver import LMA
    lma = LMA(model, devices, residual_fn=lambda a, b: a - b)
    loss, terminated = lma.step(x, y, slice_size)
    print(lma.report)

Where neither JᵀJ (P × P) nor JJᵀ (N × N) fits, ``LMA(..., strategy="matrix_free")`` (or
the planner) solves the same damped system by truncated preconditioned conjugate gradients
on Jacobian-vector and vector-Jacobian products, never forming J (Martens 2010); its
options are a ``TruncatedCG``.

``LMA(..., process_group="default")`` shares each step over the ranks of a
torch.distributed process group (each rank passes its share of the global batch).

``curve_fit(f, x, y, p0, sigma=..., bounds=..., loss=...)`` is ``scipy.optimize.curve_fit``
(its signature, returns and errors) for NumPy and torch models; ``curve_fit_result`` is the
sliced engine for large torch fits on the CPU or a GPU, with the richer result.
``curve_fit_batch(f, x, y, p0, ...)`` runs M independent small fits of one torch model at
once (ydata (M, N)), each as ``curve_fit`` would, with a status per fit.
"""

from marquardt.jacobian import ResidualNotFiniteError

from ._backends.base import ArrayBackend, LinearSystem, Solution
from ._curve.batch.curve_fit_batch import curve_fit_batch
from ._curve.curve_fit import curve_fit
from ._curve.large.fit import CurveFitResult, curve_fit_result
from ._errors import (
    BackendUnavailableError,
    BatchNotFiniteError,
    CovarianceWarning,
    CurveFitInputError,
    OptimizeWarning,
    RankFailureError,
    RanksDisagreeError,
    SolverConfigError,
    SolverInputError,
    SolverStateError,
)
from ._lm.damping.base import DampingRule
from ._lm.damping.fixed import FixedDamping
from ._lm.damping.nielsen import NielsenDamping
from ._lm.lma import LMA
from ._lm.report import StepReport
from ._lm.solve.cg_options import TruncatedCG
from ._lm.stopping.criteria import StoppingCriteria
from .timing import time

__all__ = [
    "LMA",
    "ArrayBackend",
    "BackendUnavailableError",
    "BatchNotFiniteError",
    "CovarianceWarning",
    "CurveFitInputError",
    "CurveFitResult",
    "DampingRule",
    "FixedDamping",
    "LinearSystem",
    "NielsenDamping",
    "OptimizeWarning",
    "RankFailureError",
    "RanksDisagreeError",
    "ResidualNotFiniteError",
    "Solution",
    "SolverConfigError",
    "SolverInputError",
    "SolverStateError",
    "StepReport",
    "StoppingCriteria",
    "TruncatedCG",
    "curve_fit",
    "curve_fit_batch",
    "curve_fit_result",
    "time",
]
