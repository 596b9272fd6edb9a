"""Numerical faults are rejected attempts, never crashes; parameters stay those of the
last accepted step."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch
from problems import cpu_lma, problem, residual_fn, run_to_convergence
from torch import nn

from marquardt.solver import LMA, ArrayBackend, LinearSystem, Solution
from marquardt.solver._backends.numpy_backend import NumpyBackend
from marquardt.testing.models import flat


class ScriptedBackend:
    """Wraps the NumPy backend; each solve follows a script: "ok", "fail", "nan", "shift"."""

    name = "scripted"

    def __init__(self, script: Iterable[str], default: str = "ok") -> None:
        self.inner = NumpyBackend()
        self.script = list(script)
        self.default = default
        self.calls: list[tuple[str, float]] = []
        self.systems: list[LinearSystem] = []

    def system_from_products(self, products):  # type: ignore[no-untyped-def]
        system = self.inner.system_from_products(products)
        self.systems.append(system)
        return system

    def system_from_slices(self, slices, rows, params):  # type: ignore[no-untyped-def]
        system = self.inner.system_from_slices(slices, rows, params)
        self.systems.append(system)
        return system

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        action = self.script.pop(0) if self.script else self.default
        self.calls.append((action, damping))
        if action == "fail":
            return None
        if action == "shift":  # an indefinite system: A − 5I
            import numpy as np

            shifted = LinearSystem(
                a=system.a - 5.0 * np.eye(system.a.shape[0]),
                g=system.g,
                diag=system.diag,
                rows=system.rows,
                params=system.params,
                underdetermined=False,
                rss=system.rss,
            )
            return self.inner.solve(shifted, damping, scaling)
        solution = self.inner.solve(system, damping, scaling)
        if action == "nan" and solution is not None:
            return Solution(
                delta=torch.full_like(solution.delta, float("nan")),
                gradient_dot=solution.gradient_dot,
                curvature=solution.curvature,
                damping=damping,
            )
        return solution

    def synchronize(self) -> None:
        pass


def _lma(backend: ArrayBackend, **kwargs: object) -> tuple[LMA, nn.Module]:
    return cpu_lma(problem("exponential"), backend=backend, **kwargs)


def test_failed_factorisation_is_a_rejected_attempt() -> None:
    backend = ScriptedBackend(["fail", "fail"])
    # The fixed rule makes the λ sequence of the rejections exact: ×10 each.
    lma, _ = _lma(backend, damping="fixed", damping_start=1e-3)
    prob = problem("exponential")
    loss, terminated = lma.step(prob.x, prob.y)
    report = lma.report
    assert report is not None and report.accepted and not terminated
    assert report.rejections == ["cholesky failed", "cholesky failed"]
    assert [c[1] for c in backend.calls] == pytest.approx([1e-3, 1e-2, 1e-1])
    assert report.attempts == 3
    assert lma.damping == pytest.approx(1e-2)
    assert loss < report.loss_before
    assert len(backend.systems) == 1, "a rejected attempt reuses the assembled system"


def test_indefinite_system_is_rejected_until_damping_dominates() -> None:
    backend = ScriptedBackend([], default="shift")
    lma, _ = _lma(backend, damping="nielsen", damping_start=1e-3, attempts=30)
    prob = problem("exponential")
    lma.step(prob.x, prob.y)
    report = lma.report
    assert report is not None
    assert report.rejections[0] == "cholesky failed"
    # λ·D must exceed the shift before a factorisation can succeed.
    failed = [d for a, d in backend.calls if a == "shift"]
    assert failed[0] == pytest.approx(1e-3)


def test_non_finite_step_is_rejected_and_parameters_unchanged() -> None:
    backend = ScriptedBackend([], default="nan")
    lma, model = _lma(backend, attempts=3)
    before = flat(model)
    prob = problem("exponential")
    loss, terminated = lma.step(prob.x, prob.y)
    report = lma.report
    assert report is not None and not report.accepted and not terminated
    assert report.rejections == ["non-finite step"] * 3
    assert torch.equal(flat(model), before)
    assert loss == report.loss_before


class SqrtModel(nn.Module):
    """y = b·x, whose forward is NaN for b > 2 (through sqrt(2 − b))."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b * x + 0.0 * torch.sqrt(2.0 - self.b)


def test_nan_loss_at_trial_point_is_rejected() -> None:
    x = torch.linspace(0.1, 1.0, 10, dtype=torch.float64).unsqueeze(1)
    y = 3.0 * x  # the unconstrained optimum b = 3 lies where the model is NaN
    model = SqrtModel()
    lma = LMA(model, ["cpu"], residual_fn, damping_start=1e-6, backend="torch")
    loss, _ = lma.step(x, y)
    report = lma.report
    assert report is not None
    assert report.rejections[0] == "non-finite loss"
    assert report.accepted, "a smaller step inside the domain is accepted"
    b = float(model.b.detach())
    assert 1.0 < b <= 2.0 and torch.isfinite(torch.tensor(loss))
    assert loss < report.loss_before


@pytest.mark.parametrize(("damping", "attempts"), [("fixed", 2), ("nielsen", 4)])
def test_damping_ceiling_terminates_cleanly(damping: str, attempts: int) -> None:
    # fixed: 1e-3 → 1e-2 → 1e-1; nielsen: 1e-3 → 2e-3 → 8e-3 → 6.4e-2 → 1e-1 (clamped).
    backend = ScriptedBackend([], default="fail")
    lma, model = _lma(backend, damping=damping, damping_start=1e-3, damping_max=1e-1)
    before = flat(model)
    prob = problem("exponential")
    loss, terminated = lma.step(prob.x, prob.y)
    report = lma.report
    assert terminated and report is not None
    assert report.termination == "damping_max" and "ceiling" in report.reason
    assert report.attempts == attempts and not report.accepted
    assert lma.damping == pytest.approx(1e-1)
    assert torch.equal(flat(model), before)
    assert loss == pytest.approx(report.loss_before)


def test_parameters_are_those_of_the_last_accepted_step() -> None:
    backend = ScriptedBackend(["ok"], default="nan")
    lma, model = _lma(backend, attempts=4)
    prob = problem("exponential")
    lma.step(prob.x, prob.y)
    assert lma.report is not None and lma.report.accepted
    accepted = flat(model)
    lma.step(prob.x, prob.y)
    assert lma.report is not None and not lma.report.accepted
    assert torch.equal(flat(model), accepted)


def test_converged_run_ends_at_rounding_without_moving() -> None:
    prob = problem("linear")
    lma, model = cpu_lma(
        prob,
        damping_start=1e-12,
        damping_min=1e-12,
        damping_max=1e4,
        backend="numpy",
    )
    lma.step(prob.x, prob.y)  # lands on the solution
    solution = flat(model)
    run_to_convergence(lma, prob, max_steps=10)
    assert lma.report is not None
    # At the solution the quadratic model predicts no decrease beyond rounding: the step
    # ends after its first attempt instead of climbing to the ceiling.
    assert lma.report.termination == "rounding" and lma.report.attempts == 1
    assert "rounding" in lma.report.reason
    torch.testing.assert_close(flat(model), solution, rtol=1e-12, atol=1e-14)


class _DeadParameter(nn.Module):
    """y = a·x + b with a parameter the output never uses: JᵀJ has a zero row and column."""

    def __init__(self) -> None:
        super().__init__()
        self.ab = nn.Parameter(torch.tensor([0.5, -0.2], dtype=torch.float64))
        self.dead = nn.Parameter(torch.tensor([3.0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ab[0] * x + self.ab[1]


@pytest.mark.parametrize("scaling", ["identity", "marquardt"])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_singular_system_is_solved_with_damping(backend: str, scaling: str) -> None:
    # JᵀJ is singular (the dead column is zero); λD makes it definite, the step is finite
    # and leaves the dead parameter where it was.
    x = torch.linspace(0, 1, 20, dtype=torch.float64).unsqueeze(1)
    y = 2.0 * x - 1.0
    model = _DeadParameter()
    lma = LMA(model, ["cpu"], residual_fn, backend=backend, scaling=scaling)
    for _ in range(5):
        lma.step(x, y)
        assert lma.report is not None and lma.report.accepted
        assert "cholesky failed" not in lma.report.rejections
    assert float(model.dead.detach()) == 3.0
    torch.testing.assert_close(model.ab.detach(), torch.tensor([2.0, -1.0], dtype=torch.float64))
