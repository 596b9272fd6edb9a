"""The rule every curve fit's bounds obey, whatever words refuse them: `misordered`."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["misordered"]


def misordered(lower: Any, upper: Any) -> list[Any]:
    """The indices (one tuple per entry, or an int for vectors) where a bound is NaN or the
    lower bound is not strictly below the upper one (±inf is no bound); empty when the
    bounds can be used. NumPy arrays or torch tensors, of any shape.

    Arguments:
        lower: the lower bounds.
        upper: the upper bounds, of ``lower``'s shape.

    Returns:
        The offending indices, in order.
    """
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    bad = np.isnan(lo) | np.isnan(hi) | (lo >= hi)
    found = np.argwhere(bad)
    return (
        [int(i[0]) for i in found] if bad.ndim == 1 else [tuple(int(v) for v in i) for i in found]
    )
