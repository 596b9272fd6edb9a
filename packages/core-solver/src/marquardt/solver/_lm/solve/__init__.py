"""The solve: each linear solver of an attempt a module, and their registry: `SOLVERS`,
`register_solver`, `choose_solver`.

* ``cholesky``: the dense float64 Cholesky of A + λD by the array backend (Marquardt
  1963; the under-determined dual (JJᵀ/N + λI)u = r/N, δ = Jᵀu);
* ``cg``: truncated, preconditioned conjugate gradients on the operator of a matrix-free
  step (Steihaug 1983; Martens 2010), with its preconditioners (``preconditioners``) and
  curvature subsample (``curvature``).

Adding a solver is one new module (its `LinearSolver` and `SolverKind`) and one line of
`SOLVERS` (or `register_solver` at run time). ``"auto"`` takes the first solver that serves
the step's strategy, in registry order.
"""

from __future__ import annotations

from ..._errors import SolverConfigError, message
from ..registry import Registry
from . import cg, cholesky
from .kind import LinearSolver, SolverKind, SolverParts

__all__ = [
    "SOLVERS",
    "LinearSolver",
    "SolverKind",
    "SolverParts",
    "check_solver",
    "choose_solver",
    "register_solver",
]

#: The linear solvers by name; ``"auto"`` takes the first that serves a strategy.
SOLVERS: Registry[SolverKind] = Registry(cholesky.KIND, cg.KIND)


def register_solver(kind: SolverKind) -> None:
    """Add a linear solver to the registry (or replace the one of that name).

    Arguments:
        kind: the solver's `SolverKind`.
    """
    SOLVERS.add(kind)


def check_solver(name: object) -> str:
    """``LMA(linear_solver=...)``: ``"auto"`` or a registered solver's name.

    Arguments:
        name: what was passed.

    Returns:
        The name.

    Raises:
        SolverConfigError: not a registered solver.
    """
    if name == "auto" or (isinstance(name, str) and name in SOLVERS):
        return name
    raise SolverConfigError(
        message(
            f"LMA(linear_solver={name!r}) names a linear solver",
            f"the known ones are {('auto', *SOLVERS)}",
            "pass 'auto', or register the solver (solve.register_solver)",
        )
    )


def choose_solver(name: str, strategy: str) -> SolverKind:
    """The solver of a step: the one named, or under ``"auto"`` the first that serves the
    step's strategy.

    Arguments:
        name: ``"auto"`` or a registered solver's name.
        strategy: the step's assembly strategy.

    Returns:
        The chosen `SolverKind`.

    Raises:
        SolverConfigError: the named solver does not serve the strategy.
    """
    if name != "auto":
        kind = SOLVERS[name]
        if strategy in kind.strategies:
            return kind
        raise SolverConfigError(
            message(
                f"LMA(linear_solver={name!r}) for a step of strategy {strategy!r}",
                f"it solves {kind.strategies} systems only",
                "pass linear_solver='auto', or a strategy the solver serves",
            )
        )
    for kind in SOLVERS.values():
        if strategy in kind.strategies:
            return kind
    raise SolverConfigError(
        message(
            f"a linear solver for a step of strategy {strategy!r}",
            "no registered solver serves it",
            "register one (solve.register_solver)",
        )
    )
