"""The matrix-free strategy: truncated preconditioned CG on products JᵀJv.

Against the dense step (equal to the CG tolerance), CG's two stopping rules (budget and
relative residual), a rank-deficient problem (no NaN), no P × P or N × P tensor ever
allocated, the planner's fall-back with its reason, PointResidual, and the options it
refuses before any work.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from pinn_problems import batch as pinn_batch
from pinn_problems import network as pinn_network
from pinn_problems import residual as pinn_residual
from torch import nn

from marquardt.jacobian import JacobianEngine, Replicas
from marquardt.solver import LMA, SolverConfigError, TruncatedCG
from marquardt.solver._lm.matrix_free import matrix_free_system
from marquardt.solver._lm.solve.cg import ConjugateGradients
from marquardt.testing.models import LargestTensor


def _model(hidden: int = 8, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1)).double()


def _data(n: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 2 - 1
    return x, torch.sinc(3 * x) + 0.01 * torch.randn(n, 1, generator=gen, dtype=torch.float64)


def _theta(lma: LMA) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(lma.model.parameters()).detach().clone()


def _system(model: nn.Module, x: torch.Tensor, y: torch.Tensor, probes: int = 4) -> Any:
    """The matrix-free system of (x, y) and the explicit J, r for reference."""
    engine = JacobianEngine(Replicas(model, ["cpu"]), lambda a, b: a - b)
    jac, res = engine.jacobian(x, y)
    products = engine.gauss_newton(engine.prepare(x, y, 16, strategy="matrix_free"), probes=probes)
    return matrix_free_system(products, rows=jac.shape[0]), jac, res


def _damped(system: Any, jac: torch.Tensor, lam: float, scaling: str) -> torch.Tensor:
    """A + λD of the dense step, with the D the matrix-free step uses."""
    n = jac.shape[0]
    d = system.scale(scaling, lambda diag, s: _scaling(diag, s))
    return jac.T @ jac / n + lam * torch.diag(d)


def _scaling(diag: torch.Tensor, scaling: str) -> torch.Tensor:
    from marquardt.solver._backends.scaling import scaling_diagonal_torch

    return scaling_diagonal_torch(diag, scaling)


@pytest.mark.parametrize("damping", ["nielsen", "fixed"])
def test_steps_equal_the_dense_steps_to_the_cg_tolerance(damping: str) -> None:
    """Identity scaling (D = I in both): five steps of each strategy agree to the CG
    tolerance, with the same λ and accept / reject decisions."""
    x, y = _data()
    common: dict[str, Any] = {"scaling": "identity", "damping": damping}
    dense = LMA(_model(), ["cpu"], lambda a, b: a - b, strategy="accumulate", **common)
    free = LMA(
        _model(),
        ["cpu"],
        lambda a, b: a - b,
        strategy="matrix_free",
        cg=TruncatedCG(iterations=500, tolerance=1e-12),
        **common,
    )
    start = _theta(dense)
    for _ in range(5):
        loss_dense, _ = dense.step(x, y)
        loss_free, _ = free.step(x, y)
        assert free.report is not None and dense.report is not None
        assert free.report.strategy == "matrix_free" and free.report.backend == "cg"
        assert free.report.attempts == dense.report.attempts
        assert free.report.damping == pytest.approx(dense.report.damping, rel=1e-6)
        assert loss_free == pytest.approx(loss_dense, rel=1e-8)
        rel = float((_theta(free) - _theta(dense)).norm() / _theta(dense).norm())
        assert rel < 1e-7
    assert set(free.report.cg_stops) == {"tolerance"}
    assert len(free.report.cg_iterations) == free.report.attempts
    assert float((_theta(dense) - start).norm()) > 1e-2  # the runs moved


def test_under_determined_steps_equal_the_dense_steps() -> None:
    """N = 20 < P = 49: the dense step solves (JJᵀ/N + λI)u = r/N, δ = Jᵀu, which is
    (JᵀJ/N + λI)δ = Jᵀr/N; the matrix-free step damps with I there too, whatever the
    scaling asked for."""
    x, y = _data(20)
    dense = LMA(_model(16), ["cpu"], lambda a, b: a - b)
    free = LMA(
        _model(16),
        ["cpu"],
        lambda a, b: a - b,
        strategy="matrix_free",
        cg=TruncatedCG(iterations=500, tolerance=1e-12),
    )
    for _ in range(3):
        dense.step(x, y)
        free.step(x, y)
        assert dense.report is not None and dense.report.strategy == "explicit"
        rel = float((_theta(free) - _theta(dense)).norm() / _theta(dense).norm())
        assert rel < 1e-7


@pytest.mark.parametrize("scaling", ["marquardt", "identity"])
def test_a_solve_equals_the_dense_solve_with_the_same_scaling(scaling: str) -> None:
    x, y = _data()
    system, jac, res = _system(_model(), x, y)
    lam = 1e-3
    solution = ConjugateGradients(TruncatedCG(iterations=500, tolerance=1e-13)).solve(
        system, lam, scaling
    )
    n = jac.shape[0]
    exact = torch.linalg.solve(_damped(system, jac, lam, scaling), jac.T @ res / n)
    assert solution.stop == "tolerance" and solution.status == 0.0
    torch.testing.assert_close(solution.delta, exact, rtol=1e-8, atol=1e-10)
    # The quadratic model's terms are those of the δ returned.
    assert solution.gradient_dot == pytest.approx(float(solution.delta @ jac.T @ res / n))
    jd = jac @ solution.delta
    assert solution.curvature == pytest.approx(float(jd @ jd / n))


def test_cg_stops_on_its_budget() -> None:
    x, y = _data()
    system, jac, _ = _system(_model(16), x, y)
    solver = ConjugateGradients(
        TruncatedCG(iterations=3, tolerance=1e-12, warm_start=0.0, preconditioner="jacobi")
    )
    solution = solver.solve(system, 1e-6, "marquardt")
    assert (solution.iterations, solution.stop) == (3, "budget")
    assert system.a.products.products == 3
    # Truncated: not the exact solution, but a descent step of the quadratic model.
    exact = torch.linalg.solve(_damped(system, jac, 1e-6, "marquardt"), system.g)
    assert float((solution.delta - exact).norm()) > 1e-3 * float(exact.norm())
    assert solution.predicted_reduction() > 0.0


@pytest.mark.parametrize("tolerance", [1e-1, 1e-4])
def test_cg_stops_on_its_tolerance(tolerance: float) -> None:
    x, y = _data()
    system, jac, _ = _system(_model(16), x, y)
    lam = 1e-4
    options = {"tolerance": tolerance, "preconditioner": "jacobi"}
    solution = ConjugateGradients(TruncatedCG(iterations=1000, **options)).solve(
        system, lam, "marquardt"
    )
    assert solution.stop == "tolerance"
    assert solution.iterations is not None and 0 < solution.iterations < 1000
    residual = system.g - _damped(system, jac, lam, "marquardt") @ solution.delta
    relative = float(residual.norm() / system.g.norm())
    assert relative <= tolerance
    # It stopped at the first iterate within tolerance, not long after.
    one_fewer = ConjugateGradients(
        TruncatedCG(iterations=solution.iterations - 1, **options)
    ).solve(system, lam, "marquardt")
    residual = system.g - _damped(system, jac, lam, "marquardt") @ one_fewer.delta
    assert one_fewer.stop == "budget" and float(residual.norm() / system.g.norm()) > tolerance


def test_warm_start_from_the_accepted_step_saves_iterations_and_costs_one_product() -> None:
    x, y = _data()
    system, _, _ = _system(_model(16), x, y)
    solver = ConjugateGradients(TruncatedCG(iterations=1000, tolerance=1e-8, warm_start=1.0))
    cold = solver.solve(system, 1e-3, "marquardt")
    again = solver.solve(system, 1e-3, "marquardt")
    assert again.iterations == cold.iterations  # not accepted: no warm start from it
    solver.accept()
    before = system.a.products.products
    warm = solver.solve(system, 1e-3, "marquardt")
    assert warm.iterations is not None and cold.iterations is not None
    assert warm.iterations < cold.iterations
    assert system.a.products.products - before == warm.iterations + 1


class _RankDeficient(nn.Module):
    """sinc fit by a 1-8-1 network with two exact copies of its hidden layer, summed,
    and a parameter the output does not depend on: J has zero and repeated columns."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(1, 8).double()
        self.b = nn.Linear(1, 8).double()
        self.b.load_state_dict(self.a.state_dict())
        self.out = nn.Linear(8, 1).double()
        self.unused = nn.Parameter(torch.ones(3, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.a(x)) + torch.tanh(self.b(x)) + 0.0 * self.unused.sum())


def test_a_rank_deficient_problem_gives_no_nan() -> None:
    x, y = _data(12)  # N = 12 < P = 46, and rank(J) < N as well
    lma = LMA(
        _RankDeficient(),
        ["cpu"],
        lambda a, b: a - b,
        strategy="matrix_free",
        damping_start=1e-12,
        damping_min=1e-15,
        cg=TruncatedCG(iterations=200, tolerance=1e-12),
    )
    losses = []
    for _ in range(15):
        loss, terminated = lma.step(x, y)
        losses.append(loss)
        assert torch.isfinite(_theta(lma)).all()
        if terminated:
            break
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0]
    torch.testing.assert_close(lma.model.unused.detach(), torch.ones(3, dtype=torch.float64))


def test_no_p_by_p_or_n_by_p_tensor_is_allocated() -> None:
    """P = 4,353, N = 512, slices of 32: a step's largest tensor is the Nyström sketch's
    k P-vectors, a few P-vectors (the probes' Jᵀz) or a slice's activations, far below N·P
    (2.2M) and P² (19M); the explicit
    step of the same batch, traced the same way, does allocate N × P."""

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
        ).double()

    x, y = _data(512)
    free = LMA(model(), ["cpu"], lambda a, b: a - b, strategy="matrix_free")
    params = sum(p.numel() for p in free.model.parameters())
    with LargestTensor() as seen:
        free.step(x, y, 32)
    assert free.report is not None and free.report.accepted
    assert params == 4353 and free.report.params == params
    assert seen.largest <= max(8, TruncatedCG().rank) * params, seen.largest
    explicit = LMA(model(), ["cpu"], lambda a, b: a - b, strategy="explicit")
    with LargestTensor() as dense:
        explicit.step(x, y, 32)
    assert dense.largest >= 512 * params


def test_the_memory_plan_is_linear_in_p() -> None:
    from marquardt.solver._lm.memory_fit import step_memory

    x, y = _data(64)
    needs = []
    for hidden in (64, 128, 256):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()
        ).append(nn.Linear(hidden, 1))
        engine = JacobianEngine(Replicas(model.double(), ["cpu"]), lambda a, b: a - b)
        plan = engine.prepare(x, y, 16, strategy="matrix_free").plan
        params = engine.replicas.num_params
        fit = step_memory(plan, params, 8, 1, (1 << 40, "test"), probes=4)
        needs.append((params, fit.needed - plan.chunk_bytes))
    # Bytes per parameter constant while P grows ~16×: no P² term.
    per_param = [need / p for p, need in needs]
    assert max(per_param) == pytest.approx(min(per_param), rel=1e-9)
    assert needs[-1][0] > 15 * needs[0][0]


def test_the_planner_chooses_matrix_free_when_no_dense_system_fits() -> None:
    """1-64-64-1 (P = 4,353), N = 100: the explicit step needs 7.3 MiB, the matrix-free
    step well under 4 MB; the planner says why, once, and the steps lower the loss."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    ).double()
    x, y = _data(100)
    lma = LMA(model, ["cpu"], lambda a, b: a - b, memory_limit=4_000_000)
    with pytest.warns(UserWarning, match="Stepping matrix-free") as caught:
        first, _ = lma.step(x, y)
    assert len([w for w in caught if "matrix-free" in str(w.message)]) == 1
    assert lma.report is not None and lma.report.strategy == "matrix_free"
    reason = lma.report.strategy_reason
    assert "100 x 100 (JJᵀ)" in reason and "matrix-free step needs" in reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(5):
            last, _ = lma.step(x, y)
    assert lma.report.strategy == "matrix_free" and last < first
    # With room for the dense system the planner keeps it.
    dense = LMA(_model(), ["cpu"], lambda a, b: a - b)
    dense.step(*_data())
    assert dense.report is not None and dense.report.strategy == "accumulate"


def test_a_forced_matrix_free_step_that_does_not_fit_is_refused() -> None:
    lma = LMA(_model(), ["cpu"], lambda a, b: a - b, strategy="matrix_free", memory_limit=100)
    before = _theta(lma)
    with pytest.raises(SolverConfigError, match="strategy='matrix_free'"):
        lma.step(*_data())
    torch.testing.assert_close(_theta(lma), before)


def test_point_residual_steps_lower_the_loss() -> None:
    x, y = pinn_batch(8)
    lma = LMA(pinn_network(8), ["cpu"], pinn_residual(), strategy="matrix_free")
    first, _ = lma.step(x, y)
    for _ in range(10):
        last, _ = lma.step(x, y)
    assert lma.report is not None and lma.report.strategy == "matrix_free"
    assert last < 0.1 * first


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"strategy": "matrix_free", "params_per_step": 5}, "params_per_step"),
        ({"strategy": "matrix_free", "geodesic": 0.75}, "geodesic"),
        ({"strategy": "accumulate", "cg": TruncatedCG()}, "cg="),
        ({"cg": {"iterations": 5}}, "TruncatedCG"),
        ({"strategy": "matrixfree"}, "matrix_free"),
    ],
)
def test_options_it_cannot_take_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(SolverConfigError, match=match):
        LMA(_model(), ["cpu"], lambda a, b: a - b, **options)


@pytest.mark.parametrize(
    "options",
    [
        {"iterations": 0},
        {"iterations": 2.5},
        {"tolerance": 0.0},
        {"tolerance": float("nan")},
        {"warm_start": 1.5},
        {"probes": 0},
    ],
)
def test_truncated_cg_checks_its_options(options: dict[str, Any]) -> None:
    with pytest.raises(SolverConfigError, match="TruncatedCG"):
        TruncatedCG(**options)
