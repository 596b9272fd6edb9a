"""Marquardt's diagonal scaling D, written once for every backend's arrays.

D = diag(JᵀJ)/N (Marquardt 1963), clamped from below so that a parameter whose Jacobian
column is (nearly) zero still gets damped and A + λD stays non-singular:
D_j = max(diag_j, floor), floor = RELATIVE_FLOOR · max_j diag_j over the finite entries, or
1 when there is no positive one (MINPACK's lmder uses 1 for zero column norms too; Moré
1978, §6); a non-finite entry is the floor. `scaling_diagonal` computes it with the array
calls NumPy, cuPyNumeric and torch share, on the arrays' own device and without reading
them back. When D is used, and its memory over steps, is the solver's rule
(``_lm/scaling.py``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import torch

__all__ = [
    "RELATIVE_FLOOR",
    "SCALINGS",
    "check_scaling",
    "scaling_diagonal",
    "scaling_diagonal_numpy",
    "scaling_diagonal_torch",
]

#: Names accepted by ``LMA(scaling=...)`` and ``ArrayBackend.solve``.
SCALINGS: tuple[str, ...] = ("identity", "marquardt")

#: Lower clamp for Marquardt's D, relative to the largest diagonal entry of JᵀJ/N.
RELATIVE_FLOOR = 1e-9


def check_scaling(scaling: str) -> None:
    """Refuse a scaling that is not one of ``SCALINGS``.

    Raises:
        ValueError: an unknown name, with a HINT.
    """
    if scaling not in SCALINGS:
        raise ValueError(
            f"scaling must be one of {SCALINGS}, got {scaling!r}. "
            "HINT: pass 'identity' or 'marquardt' to LMA(scaling=...)."
        )


def scaling_diagonal(diag: Any, scaling: str, xp: ModuleType) -> Any:
    """D for ``scaling`` in ``diag``'s arrays: ones for ``identity``, clamped ``diag`` for
    ``marquardt`` (module docstring).

    Arguments:
        diag: diag(JᵀJ)/N, a vector of the array library ``xp``.
        scaling: ``"identity"`` or ``"marquardt"``.
        xp: the array library: ``numpy``, ``cupynumeric`` or ``torch``.

    Returns:
        D, a vector like ``diag``.
    """
    check_scaling(scaling)
    if scaling == "identity":
        return xp.ones_like(diag)
    finite = xp.isfinite(diag)
    top = xp.where(finite, diag, xp.zeros_like(diag)).max()
    floor = xp.where(top > 0, top * RELATIVE_FLOOR, xp.ones_like(top))
    return xp.maximum(xp.where(finite, diag, floor), floor)


def scaling_diagonal_numpy(
    diag: np.ndarray[Any, np.dtype[Any]], scaling: str
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """`scaling_diagonal` as a float64 NumPy vector."""
    d: np.ndarray[Any, np.dtype[np.float64]] = np.asarray(
        scaling_diagonal(np.asarray(diag, dtype=np.float64), scaling, np), dtype=np.float64
    )
    return d


def scaling_diagonal_torch(diag: torch.Tensor, scaling: str) -> torch.Tensor:
    """`scaling_diagonal` of a torch vector, on its device."""
    d: torch.Tensor = scaling_diagonal(diag, scaling, torch)
    return d
