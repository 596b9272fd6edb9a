"""pytest plugin: SciPy's own curve_fit tests call marquardt.solver.curve_fit instead.

Loaded by ``test_scipy_suite.py`` in a child pytest run over SciPy's installed
``scipy/optimize/tests/test_minpack.py`` (its ``TestCurveFit`` class); the test modules'
``curve_fit`` (and ``optimize.curve_fit``) are replaced once collected."""

from __future__ import annotations

from typing import Any

import marquardt.solver as solver

SWAPPED: list[str] = []


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    for module in {item.module for item in items}:
        if hasattr(module, "curve_fit"):
            module.curve_fit = solver.curve_fit
            SWAPPED.append(module.__name__)
        optimize = getattr(module, "optimize", None)
        if optimize is not None:
            module.optimize = _Optimize(optimize)


class _Optimize:
    """``scipy.optimize`` with ``curve_fit`` replaced (some tests call it through the module)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return solver.curve_fit if name == "curve_fit" else getattr(self._inner, name)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"marquardt curve_fit swapped into {len(SWAPPED)} module(s)")
