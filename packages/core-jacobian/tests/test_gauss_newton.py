"""Matrix-free Gauss-Newton products: JᵀJv, Jᵀr and the Hutchinson probes of diag(JᵀJ)
against the explicit Jacobian, for residuals of the outputs and for a PointResidual."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from marquardt.jacobian import JacobianEngine, PointResidual, Replicas, ResidualGroup
from marquardt.jacobian._gauss_newton import probe_signs


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _data(n: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    return x, torch.randn(n, 3, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("slice_size", [7, None])
def test_products_equal_those_of_the_explicit_jacobian(slice_size: int | None) -> None:
    engine = JacobianEngine(Replicas(_mlp(), ["cpu"]), lambda a, b: a - b)
    x, y = _data()
    jac, res = engine.jacobian(x, y)
    batch = engine.prepare(x, y, slice_size, strategy="matrix_free")
    assert batch.strategy == "matrix_free" and "J never formed" in batch.plan.reason
    products = engine.gauss_newton(batch, probes=3, seed=5)
    v = torch.randn(jac.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(products.product(v), jac.T @ (jac @ v))
    torch.testing.assert_close(products.jtr, jac.T @ res)
    assert products.rss == pytest.approx(float(res @ res), rel=1e-12)
    assert products.rows == jac.shape[0] and products.products == 1
    # Jᵀz for the signs of the global rows.
    signs = torch.stack([probe_signs(torch.arange(jac.shape[0]), 5, k) for k in range(3)])
    torch.testing.assert_close(products.jtz, signs.double() @ jac)
    torch.testing.assert_close(products.diagonal(), (products.jtz**2).mean(0))


def test_the_probes_do_not_depend_on_the_slicing() -> None:
    engine = JacobianEngine(Replicas(_mlp(), ["cpu"]), lambda a, b: a - b)
    x, y = _data()
    whole = engine.gauss_newton(engine.prepare(x, y, None, strategy="matrix_free"), seed=3)
    cut = engine.gauss_newton(engine.prepare(x, y, 9, strategy="matrix_free"), seed=3)
    torch.testing.assert_close(whole.diagonal(), cut.diagonal())
    # Two shares of the batch placed by their offset add up to the whole.
    first = engine.gauss_newton(engine.prepare(x[:20], y[:20], strategy="matrix_free"), seed=3)
    second = engine.gauss_newton(
        engine.prepare(x[20:], y[20:], strategy="matrix_free"), seed=3, row_offset=20
    )
    torch.testing.assert_close(first.jtz + second.jtz, whole.jtz)
    other = engine.gauss_newton(engine.prepare(x, y, None, strategy="matrix_free"), seed=4)
    assert not torch.equal(other.jtz, whole.jtz)


def test_the_estimate_converges_to_the_diagonal() -> None:
    engine = JacobianEngine(Replicas(_mlp(), ["cpu"]), lambda a, b: a - b)
    x, y = _data()
    jac, _ = engine.jacobian(x, y)
    exact = (jac * jac).sum(0)
    batch = engine.prepare(x, y, strategy="matrix_free")
    few = engine.gauss_newton(batch, probes=2).diagonal()
    many = engine.gauss_newton(batch, probes=4000).diagonal()
    error = float(((many - exact) / exact).abs().median())
    assert error < 0.05
    assert error < float(((few - exact) / exact).abs().median())


def test_signs_are_balanced_and_vary_with_the_seed() -> None:
    rows = torch.arange(100000)
    signs = probe_signs(rows, 0, 0)
    assert set(signs.unique().tolist()) == {-1, 1}
    assert abs(float(signs.double().mean())) < 0.02
    assert float((signs == probe_signs(rows, 1, 0)).double().mean()) == pytest.approx(0.5, abs=0.02)
    assert float((signs == probe_signs(rows, 0, 1)).double().mean()) == pytest.approx(0.5, abs=0.02)


def _pde(u: Any, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return -torch.func.hessian(u)(x).trace() - f


def _boundary(u: Any, x: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return u(x)


def test_products_of_a_point_residual() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    residual = PointResidual(ResidualGroup("pde", _pde), ResidualGroup("boundary", _boundary))
    engine = JacobianEngine(Replicas(model, ["cpu"]), residual)
    gen = torch.Generator().manual_seed(0)
    inner = torch.rand(12, 2, dtype=torch.float64, generator=gen)
    edge = torch.rand(6, 2, dtype=torch.float64, generator=gen).round()
    x, y = residual.batch(pde=(inner, torch.ones(12, dtype=torch.float64)), boundary=edge)
    jac, res = engine.jacobian(x, y)
    products = engine.gauss_newton(engine.prepare(x, y, 5, strategy="matrix_free"))
    v = torch.randn(jac.shape[1], dtype=torch.float64)
    torch.testing.assert_close(products.product(v), jac.T @ (jac @ v))
    torch.testing.assert_close(products.jtr, jac.T @ res)


def test_a_batch_planned_for_another_strategy_is_refused() -> None:
    engine = JacobianEngine(Replicas(_mlp(), ["cpu"]), lambda a, b: a - b)
    x, y = _data()
    with pytest.raises(ValueError, match="strategy='matrix_free'"):
        engine.gauss_newton(engine.prepare(x, y, strategy="accumulate"))
