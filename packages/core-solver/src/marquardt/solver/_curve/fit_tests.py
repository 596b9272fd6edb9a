"""The fit tests of one fit and its evaluation budget, which every driver applies: `FitTests`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FitTests"]


@dataclass(frozen=True)
class FitTests:
    """The fit tests: SciPy's stopping tests of one fit (``least_squares``' ftol, xtol and
    gtol; Moré 1978, ``_rules``) and its evaluation budget ``max_nfev``. Not
    `StoppingCriteria`, the mean-loss tests an `LMA` step applies."""

    ftol: float
    xtol: float
    gtol: float
    max_nfev: int

    def tolerances(self) -> dict[str, float]:
        """``{"ftol": ..., "xtol": ..., "gtol": ...}``, the drivers' keywords."""
        return {"ftol": self.ftol, "xtol": self.xtol, "gtol": self.gtol}
