"""Gauss-Newton products from a subsample of the samples, and in blocks: against the
explicit Jacobian, exact for the whole batch, and unbiased over random draws; by
``jvp``/``vjp`` through the model and from the subsample's rows of J formed explicitly."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.jacobian import JacobianEngine, Replicas


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _setup(
    n: int = 40, slice_size: int | None = 7, explicit: bool = True
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    y = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    engine = JacobianEngine(Replicas(_mlp(), ["cpu"]), lambda a, b: a - b)
    jac, _ = engine.jacobian(x, y)
    products = engine.gauss_newton(engine.prepare(x, y, slice_size, strategy="matrix_free"))
    assert products.explicit_samples > n  # a small model: any subsample's J_S is formed
    if not explicit:
        products.explicit_samples = 0  # products through the model only
    v = torch.randn(jac.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    return products, jac, v


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("slice_size", [7, None])
def test_the_whole_batch_as_subsample_is_exact(slice_size: int | None, explicit: bool) -> None:
    products, jac, v = _setup(slice_size=slice_size, explicit=explicit)
    full = jac.T @ (jac @ v)
    products.use_samples(torch.arange(40))
    assert products.curvature_samples == 40
    torch.testing.assert_close(products.product(v), full, rtol=1e-12, atol=1e-12)
    # A subsample's product is (N/|S|)·J_SᵀJ_S v, rows of sample i being 3i … 3i + 2.
    index = torch.tensor([3, 11, 12, 30])
    products.use_samples(index)
    assert (products._rows is not None) == explicit
    rows = (3 * index[:, None] + torch.arange(3)).reshape(-1)
    sub = jac[rows]
    torch.testing.assert_close(products.product(v), 10.0 * sub.T @ (sub @ v))
    products.use_samples(None)
    torch.testing.assert_close(products.product(v), full)


@pytest.mark.parametrize("explicit", [True, False])
def test_a_block_of_products_equals_the_products_one_by_one(explicit: bool) -> None:
    products, jac, _ = _setup(explicit=explicit)
    vs = torch.randn(
        5, jac.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    before = products.products
    out = products.block(vs)
    assert products.products - before == 5
    torch.testing.assert_close(out, (jac.T @ (jac @ vs.T)).T)
    products.use_samples(torch.tensor([0, 5, 6]))
    torch.testing.assert_close(products.block(vs), torch.stack([products.product(v) for v in vs]))


@pytest.mark.parametrize("explicit", [True, False])
def test_subsampled_products_equal_the_full_product_in_expectation(explicit: bool) -> None:
    """N = 40 samples, |S| = 8 drawn uniformly without replacement, T = 400 draws: the mean
    of (N/|S|)·J_SᵀJ_S v is within 4 standard errors of JᵀJv, the standard error coming
    from the samples' own terms x_i = J_iᵀJ_i v: Var = N²(1 − |S|/N)·s²/|S| per draw
    (s² their sample variance, with the finite-population correction), divided by T."""
    n, size, draws = 40, 8, 400
    products, jac, v = _setup(n, explicit=explicit)
    full = jac.T @ (jac @ v)
    terms = torch.stack([jac[3 * i : 3 * i + 3].T @ (jac[3 * i : 3 * i + 3] @ v) for i in range(n)])
    per_draw = n**2 * (1 - size / n) * terms.var(dim=0, unbiased=True) / size
    standard_error = math.sqrt(float(per_draw.sum()) / draws)
    gen = torch.Generator().manual_seed(7)
    total = torch.zeros_like(full)
    for _ in range(draws):
        products.use_samples(torch.randperm(n, generator=gen)[:size])
        total += products.product(v)
    error = float((total / draws - full).norm())
    assert error <= 4 * standard_error
    # Not trivially so: one draw alone is far off.
    products.use_samples(torch.arange(size))
    assert float((products.product(v) - full).norm()) > 4 * standard_error
