"""MINPACK's gtol, asked before the attempts: max_j |J_jᵀr| / (‖J_j‖·‖r‖) ≤ gtol.

The residual is orthogonal to every column of J to within gtol (Moré 1978); columns with
‖J_j‖ = 0 are skipped, and a zero residual satisfies it. The cosine is ``_rules.gtol_met``'s,
the one the curve fits ask, read here from the step's system.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..._backends.systems import host_vector
from ..._rules import gtol_met as cosine_met
from ..numbers import positive_number
from .kind import StopFacts, StopKind

__all__ = ["KIND", "gtol_met"]


def gtol_met(gtol: float, gradient: Any, diag: Any, rss: float, rows: int) -> bool:
    """max_j |J_jᵀr| / (‖J_j‖‖r‖) ≤ gtol, from g = Jᵀr/N, diag(JᵀJ)/N and ‖r‖².

    |g_j| / (√diag_j · √(‖r‖²/N)) is exactly that cosine.

    Arguments:
        gtol: the tolerance.
        gradient: ``g = Jᵀr/N`` (a NumPy vector).
        diag: ``diag(JᵀJ)/N``.
        rss: ``‖r‖²``.
        rows: ``N``.

    Returns:
        Whether the test holds.
    """
    if not (rss > 0.0):
        return True
    norms = np.sqrt(np.maximum(diag, 0.0))
    held = np.zeros(norms.shape, dtype=bool)
    return bool(cosine_met(gradient, held, norms, math.sqrt(rss / rows), gtol))


def _met(gtol: float, facts: StopFacts) -> str | None:
    system = facts.system
    gradient, diag = host_vector(system.gradient), host_vector(system.diag)
    if gtol_met(gtol, gradient, diag, system.rss, system.rows):
        return "gtol: the residual is orthogonal to the Jacobian columns"
    return None


#: gtol in the registry of stopping tests.
KIND = StopKind("gtol", "before", _met, check=lambda v: positive_number("gtol", v, allow_zero=True))
