"""The dense solve: the float64 Cholesky factorisation of A + λD, by the array backend that
assembled the system (NumPy's, torch's or cuPyNumeric's; ``_backends``).

A failed factorisation is a rejected attempt, never an error (``Solution.status``).
"""

from __future__ import annotations

from ..._backends.base import ArrayBackend, LinearSystem, Solution
from .kind import LinearSolver, SolverKind, SolverParts

__all__ = ["KIND", "BackendCholesky"]


class BackendCholesky:
    """The backend's own Cholesky solve (`LinearSolver`).

    Arguments:
        backend: the array backend; its name is the solver's in reports.
    """

    def __init__(self, backend: ArrayBackend) -> None:
        self.backend = backend
        self.name = backend.name

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        return self.backend.solve(system, damping, scaling)

    def accept(self) -> None:
        """Nothing kept between solves."""


def _make(parts: SolverParts) -> LinearSolver:
    return BackendCholesky(parts.backend)


#: The dense Cholesky solve in the registry of solvers.
KIND = SolverKind("cholesky", ("accumulate", "explicit"), _make, fused=True)
