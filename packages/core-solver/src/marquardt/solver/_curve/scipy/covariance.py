"""pcov as SciPy's ``curve_fit`` computes it, per ``method``, from J at p̂."""

from __future__ import annotations

import warnings

import numpy as np

from ..._errors import CovarianceWarning, user_stacklevel
from ..._rules import covariance_scale, pseudo_inverse_gram

__all__ = ["columns_dependent", "leastsq_info", "pcov", "pivoted_qr", "warn_indeterminate"]

#: ε^½: beyond a condition number of 1/ε^½ for J's scaled columns, the condition number of
#: (JᵀJ)⁻¹ passes 1/ε and its float64 rounding reaches its smallest eigenvalues.
_COLUMN_CONDITION = float(np.finfo(np.float64).eps) ** -0.5


def pivoted_qr(jac: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, R and the pivots of J's column-pivoted thin QR (MINPACK's factor)."""
    try:
        from scipy.linalg import qr

        q, r, piv = qr(jac, mode="economic", pivoting=True)
        return q, r, piv
    except ImportError:  # pragma: no cover - SciPy is optional
        q, r = np.linalg.qr(jac)
        return q, r, np.arange(jac.shape[1])


def columns_dependent(jac: np.ndarray) -> bool:
    """Whether J's columns, each scaled to unit norm, have a condition number beyond 1/ε^½:
    then (JᵀJ)⁻¹ has one beyond 1/ε, no float64 matrix holds it to any relative accuracy,
    and the rounding of its largest entries makes some eigenvalues negative."""
    norms = np.linalg.norm(jac, axis=0)
    if (
        jac.shape[0] < jac.shape[1]
        or jac.size == 0
        or not np.all(np.isfinite(jac))
        or np.any(norms == 0)
    ):
        return True
    s = np.linalg.svd(jac / norms, compute_uv=False)
    return bool(s[-1] * _COLUMN_CONDITION < s[0])


def _unscaled_lm(jac: np.ndarray) -> np.ndarray | None:
    """(JᵀJ)⁻¹ as SciPy's "lm" branch (leastsq) has it: R⁻¹R⁻ᵀ from J's QR factor; None
    (an indeterminate covariance) when R is exactly singular (a zero column of J)."""
    size = jac.shape[1]
    r = np.asarray(np.linalg.qr(jac, mode="r"))
    if r.shape[0] < size or np.any(np.diag(r) == 0) or not np.all(np.isfinite(r)):
        return None
    inv_r = np.linalg.solve(np.triu(r), np.eye(size))
    return np.asarray(inv_r @ inv_r.T)


def _unscaled_least_squares(jac: np.ndarray) -> np.ndarray | None:
    """(JᵀJ)⁺ as SciPy's least_squares branch has it: J's SVD without the singular values
    below ε·max(N, P)·s₀."""
    _, s, vt = np.linalg.svd(jac, full_matrices=False)
    if s.size == 0 or not np.all(np.isfinite(s)):
        return None
    return np.asarray(pseudo_inverse_gram(s, vt, jac.shape[0], float(np.finfo(float).eps)))


def pcov(
    jac: np.ndarray, cost2: float, n_points: int, n_params: int, absolute: bool, method: str
) -> np.ndarray:
    """SciPy's covariance for ``method``, scaled by s² = 2C/(N − P) unless ``absolute``."""
    unscaled = _unscaled_lm(jac) if method == "lm" else _unscaled_least_squares(jac)
    indeterminate = np.full((n_params, n_params), np.inf)
    if unscaled is None or np.isnan(unscaled).any():
        pcov = indeterminate
    elif absolute:
        pcov = unscaled
    else:
        scale = covariance_scale(cost2, n_points, n_params)
        pcov = unscaled * scale if np.isfinite(scale) else indeterminate
    if pcov is indeterminate:
        warn_indeterminate()
    return pcov


def warn_indeterminate() -> None:
    """SciPy's warning for a pcov that could not be estimated, pointing at the user's line."""
    warnings.warn(
        "Covariance of the parameters could not be estimated",
        CovarianceWarning,
        stacklevel=user_stacklevel(),
    )


def leastsq_info(final: np.ndarray, residuals: np.ndarray) -> dict[str, np.ndarray]:
    """leastsq's ``infodict`` entries of J at p̂: R of its pivoted QR factor (transposed),
    the pivots (from 1) and Qᵀr."""
    q, r, piv = pivoted_qr(final)
    return {"fjac": r.T, "ipvt": piv + 1, "qtf": q.T @ residuals}
