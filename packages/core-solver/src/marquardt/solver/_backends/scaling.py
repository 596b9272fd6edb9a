"""Marquardt's diagonal scaling D in each backend's arrays: the clamp and the NumPy form.

D = diag(JᵀJ)/N (Marquardt 1963), clamped from below so that a parameter whose Jacobian
column is (nearly) zero still gets damped and A + λD stays non-singular:
D_j = max(diag_j, floor), floor = RELATIVE_FLOOR · max_j diag_j, or 1 when the diagonal
is zero or not finite (MINPACK's lmder uses 1 for zero column norms too; Moré 1978, §6).
The torch and cuPyNumeric backends apply the same clamp with their own array calls. When
D is used, and its memory over steps, is the solver's rule (``_lm/scaling.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["RELATIVE_FLOOR", "SCALINGS", "marquardt_floor", "scaling_diagonal_numpy"]

#: Names accepted by ``LMA(scaling=...)`` and ``ArrayBackend.solve``.
SCALINGS: tuple[str, ...] = ("identity", "marquardt")

#: Lower clamp for Marquardt's D, relative to the largest diagonal entry of JᵀJ/N.
RELATIVE_FLOOR = 1e-9


def marquardt_floor(diag_max: float) -> float:
    """The lower clamp of D for a diagonal whose largest entry is ``diag_max``.

    RELATIVE_FLOOR·diag_max, or 1.0 when the diagonal is zero or not finite (no scale to
    be relative to; MINPACK's lmder uses 1 for zero column norms too).
    """
    if not np.isfinite(diag_max) or diag_max <= 0.0:
        return 1.0
    return RELATIVE_FLOOR * float(diag_max)


def scaling_diagonal_numpy(
    diag: np.ndarray[Any, np.dtype[Any]], scaling: str
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """D as a float64 vector: ones for ``identity``, clamped ``diag`` for ``marquardt``.

    Works for NumPy arrays; the torch and cuPyNumeric backends apply the same rule with
    their own array calls (``marquardt_floor`` gives the clamp).
    """
    d = np.asarray(diag, dtype=np.float64)
    if scaling == "identity":
        return np.ones_like(d)
    if scaling == "marquardt":
        finite = d[np.isfinite(d)]
        floor = marquardt_floor(float(finite.max()) if finite.size else 0.0)
        return np.maximum(np.where(np.isfinite(d), d, floor), floor)
    raise ValueError(
        f"scaling must be one of {SCALINGS}, got {scaling!r}. HINT: use 'identity' or 'marquardt'."
    )
