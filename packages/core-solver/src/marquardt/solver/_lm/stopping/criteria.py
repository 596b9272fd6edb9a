"""`StoppingCriteria`: `LMA`'s mean-loss tests' tolerances as one value, MINPACK-style
convergence tests on L = ‖r‖²/N (Moré, Garbow & Hillstrom 1980, lmder), off unless set.
Each formula is its test module's (``ftol``, ``xtol``, ``gtol``). Not the fit tests of
``_rules`` (SciPy's, on the cost of one fit), which the curve fits' drivers apply.

``LMA(stopping=StoppingCriteria(...))`` is the same as its three keywords; each test that
holds is reported by its name as the termination reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .ftol import ftol_met
from .gtol import gtol_met
from .xtol import xtol_met

__all__ = ["StoppingCriteria"]


@dataclass(frozen=True)
class StoppingCriteria:
    """ftol / xtol / gtol tolerances; ``None`` switches a test off.

    Arguments:
        ftol: the bound on the relative actual and predicted reductions of the loss.
        xtol: the bound on the step relative to the parameters, ‖s‖ ≤ xtol·‖x‖.
        gtol: the bound on the cosine between the residual and each column of ``J``.
    """

    ftol: float | None = None
    xtol: float | None = None
    gtol: float | None = None

    def ftol_met(self, loss_before: float, actual: float, predicted: float) -> bool:
        """Relative actual and predicted reductions both ≤ ftol (and ρ ≤ 2).

        Arguments:
            loss_before: the loss ``L`` at the start of the step.
            actual: the step's actual reduction of the loss.
            predicted: the reduction the linear model predicted.

        Returns:
            Whether the test holds (False when ``ftol`` is off).
        """
        return self.ftol is not None and ftol_met(self.ftol, loss_before, actual, predicted)

    def xtol_met(self, step_norm: float, param_norm: float) -> bool:
        """‖s‖ ≤ xtol·‖x‖.

        Arguments:
            step_norm: ‖s‖.
            param_norm: ‖x‖.

        Returns:
            Whether the test holds (False when ``xtol`` is off).
        """
        return self.xtol is not None and xtol_met(self.xtol, step_norm, param_norm)

    def gtol_met(
        self,
        gradient: np.ndarray[Any, np.dtype[np.float64]],
        diag: np.ndarray[Any, np.dtype[np.float64]],
        rss: float,
        rows: int,
    ) -> bool:
        """max_j |J_jᵀr| / (‖J_j‖‖r‖) ≤ gtol, from g = Jᵀr/N, diag(JᵀJ)/N and ‖r‖².

        |g_j| / sqrt(diag_j · ‖r‖²/N) is exactly the cosine above. A zero residual
        satisfies the test (nothing is left to fit).

        Arguments:
            gradient: ``g = Jᵀr/N``.
            diag: ``diag(JᵀJ)/N``.
            rss: ``‖r‖²``.
            rows: ``N``.

        Returns:
            Whether the test holds (False when ``gtol`` is off).
        """
        return self.gtol is not None and gtol_met(self.gtol, gradient, diag, rss, rows)

    def values(self) -> dict[str, float]:
        """The tolerances that are on, by name (the options of ``stopping.Stops``).

        Returns:
            ``{"ftol": ..., ...}`` without those that are None.
        """
        given = {"ftol": self.ftol, "xtol": self.xtol, "gtol": self.gtol}
        return {name: value for name, value in given.items() if value is not None}
