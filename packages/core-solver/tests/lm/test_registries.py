"""A damping rule, a stopping test and a linear solver each added by one registry line, and
run by `LMA` and `curve_fit_result` (the LM of curve_fit's sliced engine)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from marquardt.solver import (
    LMA,
    Solution,
    SolverConfigError,
    StoppingCriteria,
    curve_fit_result,
)
from marquardt.solver._backends.base import LinearSystem
from marquardt.solver._backends.scaling import scaling_diagonal_torch
from marquardt.solver._lm.damping import DAMPING, DampingArgs, DampingKind, register_damping
from marquardt.solver._lm.damping.base import Clamped, DampingRule
from marquardt.solver._lm.numbers import positive_number
from marquardt.solver._lm.solve import SOLVERS, LinearSolver, SolverKind, register_solver
from marquardt.solver._lm.stopping import STOPPING, StopFacts, StopKind, register_stop

TRUE = (2.0, -1.5)


class Exponential(nn.Module):
    """y = a·exp(b·x)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
        self.b = nn.Parameter(torch.tensor(0.0, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a * torch.exp(self.b * x)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(0.0, 2.0, 40, dtype=torch.float64).reshape(-1, 1)
    return x, TRUE[0] * torch.exp(TRUE[1] * x)


def _curve(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * torch.exp(b * x)


def _fit(steps: int = 60, **keywords: object) -> tuple[LMA, Exponential]:
    model = Exponential()
    lma = LMA(model, [torch.device("cpu")], lambda a, b: a - b, **keywords)  # type: ignore[arg-type]
    x, y = _data()
    for _ in range(steps):
        _, terminated = lma.step(x, y)
        if terminated:
            break
    return lma, model


def _curve_fit(**options: object) -> tuple[torch.Tensor, int]:
    x, y = _data()
    result = curve_fit_result(
        _curve, x.reshape(-1), y.reshape(-1), torch.tensor([1.0, 0.0]), lma_options=options
    )
    return result.popt, result.steps


# -- a damping rule: one module (here, this class and its kind) and one registry line --------
class HalvingDamping(Clamped):
    """Accept when the loss decreases; λ ← λ/2 on acceptance, λ ← 4λ on rejection."""

    name = "halving"
    calls = 0

    def accepts(self, actual: float, predicted: float) -> bool:
        return math.isfinite(actual) and actual > 0.0

    def on_accept(self, actual: float, predicted: float) -> None:
        HalvingDamping.calls += 1
        self.damping = self._clamp(self.damping / 2.0)

    def on_reject(self) -> None:
        self.damping = self._clamp(self.damping * 4.0)


def _halving(args: DampingArgs) -> DampingRule:
    return HalvingDamping(args.start, args.minimum, args.maximum)


# -- a stopping test: the wall time since the first step ----------------------------------
def _over_time(limit: float, facts: StopFacts) -> str | None:
    return f"max_seconds: {facts.seconds:.3g} s ≥ {limit:g} s" if facts.seconds >= limit else None


# -- a linear solver: least squares of the damped system ------------------------------------
class LstsqSolver:
    """δ from ``torch.linalg.lstsq`` of (A + λD)δ = g (over-determined systems)."""

    name = "lstsq"
    calls = 0

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        LstsqSolver.calls += 1
        a, g = system.a, system.g
        d = system.scale(scaling, scaling_diagonal_torch)
        m = a + torch.diag(d * damping)
        delta = torch.linalg.lstsq(m, g.reshape(-1, 1)).solution.reshape(-1)
        return Solution(
            delta=delta, gradient_dot=delta @ g, curvature=delta @ (a @ delta), damping=damping
        )

    def accept(self) -> None:
        """Nothing kept between solves."""


@pytest.fixture
def registered() -> Iterator[None]:
    saved = (dict(DAMPING), dict(STOPPING), dict(SOLVERS))
    register_damping(DampingKind("halving", HalvingDamping, _halving))
    register_stop(
        StopKind(
            "max_seconds",
            "step",
            _over_time,
            check=lambda v: positive_number("max_seconds", v, allow_zero=True),
        )
    )
    register_solver(SolverKind("lstsq", ("accumulate", "explicit"), lambda parts: LstsqSolver()))
    try:
        yield
    finally:
        for registry, held in zip((DAMPING, STOPPING, SOLVERS), saved, strict=True):
            registry.clear()
            registry.update(held)  # type: ignore[attr-defined]


def test_a_registered_damping_rule_drives_lma_and_curve_fit(registered: None) -> None:
    HalvingDamping.calls = 0
    lma, model = _fit(damping="halving", compile_attempt="on")
    assert isinstance(lma.damping_rule, HalvingDamping)
    assert HalvingDamping.calls > 0
    assert lma.report is not None and lma.report.attempt_path == "eager"
    assert lma.report.attempt_reason == "a damping rule without a tensor form"
    assert float(model.a.detach()) == pytest.approx(TRUE[0], rel=1e-6)
    assert float(model.b.detach()) == pytest.approx(TRUE[1], rel=1e-6)
    before = HalvingDamping.calls
    popt, _ = _curve_fit(damping="halving")
    assert HalvingDamping.calls > before
    assert popt.tolist() == pytest.approx(list(TRUE), rel=1e-6)


def test_an_unregistered_damping_rule_is_refused() -> None:
    with pytest.raises(SolverConfigError, match="halving"):
        _fit(steps=1, damping="halving")


def test_a_registered_stopping_test_ends_lma_and_curve_fit(registered: None) -> None:
    lma, _ = _fit(stopping={"max_seconds": 0.0})
    assert lma.steps == 1
    assert lma.report is not None and lma.report.terminated
    assert lma.report.termination == "max_seconds"
    assert lma.report.reason.startswith("max_seconds:")
    lma, _ = _fit(steps=3, stopping={"max_seconds": 1e9})
    assert lma.steps == 3 and lma.report is not None and lma.report.termination is None
    _, steps = _curve_fit(stopping={"max_seconds": 0.0})
    assert steps == 1
    _, steps = _curve_fit()
    assert steps > 1


def test_a_stopping_test_checks_its_option(registered: None) -> None:
    with pytest.raises(SolverConfigError, match="max_seconds"):
        _fit(steps=1, stopping={"max_seconds": -1.0})
    with pytest.raises(SolverConfigError, match="no_such_test"):
        _fit(steps=1, stopping={"no_such_test": 1.0})


def test_a_registered_linear_solver_solves_lma_and_curve_fit(registered: None) -> None:
    LstsqSolver.calls = 0
    lma, model = _fit(backend="torch", linear_solver="lstsq")
    assert LstsqSolver.calls > 0
    assert lma.report is not None and lma.report.backend == "lstsq"
    _, reference = _fit(backend="torch")
    assert float(model.a.detach()) == pytest.approx(float(reference.a.detach()), rel=1e-9)
    assert float(model.b.detach()) == pytest.approx(float(reference.b.detach()), rel=1e-9)
    before = LstsqSolver.calls
    popt, _ = _curve_fit(backend="torch", linear_solver="lstsq")
    assert LstsqSolver.calls > before
    assert popt.tolist() == pytest.approx(list(TRUE), rel=1e-6)


def test_a_solver_that_does_not_serve_the_strategy_is_refused(registered: None) -> None:
    with pytest.raises(SolverConfigError, match="lstsq"):
        _fit(steps=1, backend="torch", linear_solver="lstsq", strategy="matrix_free")


def test_the_default_kinds_are_the_registries_first(registered: None) -> None:
    assert isinstance(LstsqSolver(), LinearSolver)
    assert list(SOLVERS)[:2] == ["cholesky", "cg"]
    assert {"fixed", "nielsen", "halving"} <= set(DAMPING)
    assert list(STOPPING)[:5] == ["gtol", "ftol", "xtol", "rounding", "damping_max"]


def test_stopping_criteria_are_the_keywords() -> None:
    by_keyword, _ = _fit(steps=40, xtol=1e-3)
    by_criteria, _ = _fit(steps=40, stopping=StoppingCriteria(xtol=1e-3))
    assert by_keyword.report is not None and by_criteria.report is not None
    assert by_keyword.report.termination == by_criteria.report.termination == "xtol"
    assert by_keyword.steps == by_criteria.steps
    with pytest.raises(SolverConfigError, match="ftol"):
        _fit(steps=1, ftol=1e-3, stopping={"ftol": 1e-4})
