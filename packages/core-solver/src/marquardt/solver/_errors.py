"""Errors raised by ``marquardt.solver``.

Every error is raised before any work starts and leaves the model and the solver state
unchanged. Messages say what was asked, what was found and how to fix it ("HINT:").
Non-convergence is never an error: it is reported in ``LMA.report``.
"""

from __future__ import annotations

from marquardt.devices.messages import message

__all__ = [
    "BackendUnavailableError",
    "BatchNotFiniteError",
    "CompileWarning",
    "CovarianceWarning",
    "CurveFitInputError",
    "OptimizeWarning",
    "RankFailureError",
    "RanksDisagreeError",
    "SolverConfigError",
    "SolverInputError",
    "SolverStateError",
    "message",
]


class SolverConfigError(ValueError):
    """An ``LMA`` constructor argument is out of range or of the wrong kind."""


class SolverInputError(ValueError):
    """A batch given to ``LMA.step`` cannot be used (shape, dtype, device, NaN, slice size)."""


class CurveFitInputError(SolverInputError):
    """An argument of ``curve_fit`` cannot be used (shape, value, bounds, what ``f`` returns)."""


class BatchNotFiniteError(SolverInputError):
    """The inputs or targets given to ``LMA.step`` hold NaN or infinity."""


class SolverStateError(ValueError):
    """A state dict given to ``LMA.load_state_dict`` does not fit this solver."""


class BackendUnavailableError(RuntimeError):
    """The requested array backend cannot run here (package missing, no Legate runtime)."""


class RankFailureError(RuntimeError):
    """A collective of an LM step failed: a peer rank died, hung or raised before it."""


class RanksDisagreeError(RuntimeError):
    """The ranks of a process group ended an LM step in different states (debug check)."""


try:  # SciPy's class when SciPy is installed, so its warning filters catch ours.
    from scipy.optimize import OptimizeWarning as _Base
except ImportError:  # pragma: no cover - SciPy is optional
    _Base = UserWarning  # type: ignore[misc,assignment,unused-ignore]


class OptimizeWarning(_Base):  # type: ignore[misc,valid-type,unused-ignore]
    """A fit stopped before a stopping test held, or its covariance could not be estimated;
    a subclass of ``scipy.optimize.OptimizeWarning`` when SciPy is installed (else of
    ``UserWarning``), so ``pytest.warns`` and warning filters written for SciPy catch it."""


class CovarianceWarning(OptimizeWarning):
    """The covariance of the parameters could not be estimated (all entries are inf)."""


class CompileWarning(UserWarning):
    """``curve_fit_batch`` could not compile its iteration and ran it eagerly instead."""
