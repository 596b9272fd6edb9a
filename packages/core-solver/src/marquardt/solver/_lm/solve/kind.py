"""The linear solve of an attempt as a protocol apart from the assembly: `LinearSolver`,
and what the registry of solvers holds for each: `SolverKind`, `SolverParts`.

The step's system (A + λD)δ = g is assembled once (``_lm.assembly``, by the array
backend); a solver solves it for each λ the attempts try, and returns a ``Solution`` (δ and
the quadratic model's terms δᵀg, δᵀAδ) or None for a failed solve, a rejected attempt.
Which solver a step uses is chosen by its strategy (``choose_solver``), or named
(``LMA(linear_solver=...)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..._backends.base import ArrayBackend, LinearSystem, Solution

__all__ = ["LinearSolver", "SolverKind", "SolverParts"]


@runtime_checkable
class LinearSolver(Protocol):
    """δ for one λ from the step's assembled system.

    Attributes:
        name: the solver's name in reports (``StepReport.backend``).
    """

    name: str

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        """δ solving (A + λD)δ = g (or the under-determined dual).

        Arguments:
            system: the step's assembled system.
            damping: λ.
            scaling: D's name (``"identity"``, ``"marquardt"``).

        Returns:
            The `Solution`, or None when the solve failed (a rejected attempt).
        """
        ...

    def accept(self) -> None:
        """The last solve's δ was accepted (a warm start may keep it)."""
        ...


@dataclass(frozen=True)
class SolverParts:
    """What solvers are made from: the solver's array backend and its conjugate gradients
    (which keep their state across steps).

    Arguments:
        backend: the array backend that assembled the system.
        cg: the conjugate gradients of matrix-free steps.
    """

    backend: ArrayBackend
    cg: LinearSolver


@dataclass(frozen=True)
class SolverKind:
    """One linear solver as the registry holds it.

    Arguments:
        name: what ``LMA(linear_solver=...)`` calls it.
        strategies: the assembly strategies whose systems it solves (``"accumulate"``,
            ``"explicit"``: dense ``a``; ``"matrix_free"``: ``a`` an operator).
        make: the solver, from the step's `SolverParts`.
        fused: whether the pure tensor attempt (``attempt.pure``) solves as it does (the
            float64 Cholesky of ``factor_solve``), so the compiled and captured attempts
            may stand in for it.
    """

    name: str
    strategies: tuple[str, ...]
    make: Callable[[SolverParts], LinearSolver]
    fused: bool = False
