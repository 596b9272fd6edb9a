"""Errors raised by ``marquardt.solver``.

Every error is raised before any work starts and leaves the model and the solver state
unchanged. Messages say what was asked, what was found and how to fix it ("HINT:").
Non-convergence is never an error: it is reported in ``LMA.report``.
"""

from __future__ import annotations

import os
import sys

import marquardt.devices
import marquardt.jacobian
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
    "user_stacklevel",
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


#: The folders of the marquardt packages a solver call passes through (this one, the
#: Jacobian's, the devices'): frames there are the library's, not the caller's.
_LIBRARY = tuple(
    os.path.dirname(path) + os.sep
    for path in (__file__, marquardt.jacobian.__file__, marquardt.devices.__file__)
)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called in the same frame as this,
    name the first frame outside the marquardt packages: the line of the user's call.

    Returns:
        1 for the calling frame, plus one per library frame above it (entry-point wrappers
        such as ``keeps_grad_mode`` included).
    """
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARY):
        frame = frame.f_back
        level += 1
    return level
