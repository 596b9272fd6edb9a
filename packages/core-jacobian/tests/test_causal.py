"""Causal weights (Wang, Sankaran & Perdikaris 2022): the rows of the weighted group scaled
by √w of their time bin, the weights recomputed from the bins' mean squared residuals, and
the forward-Laplacian J of the weighted group equal to the generic one."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.jacobian import CausalWeights, JacobianEngine, PointResidual, Replicas, ResidualGroup

F64 = torch.float64


def _heat(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return u.grad(p)[1] - 0.4 * u.hessian_diagonal(p)[0]


def _initial(u: Any, p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return u(p) - y


def _problem(causal: CausalWeights) -> tuple[PointResidual, nn.Module, torch.Tensor, torch.Tensor]:
    residual = PointResidual(
        ResidualGroup("pde", causal.weigh(_heat)), ResidualGroup("initial", _initial)
    )
    gen = torch.Generator().manual_seed(2)
    inner = torch.rand(40, 2, generator=gen, dtype=F64)
    x0 = torch.rand(10, 1, generator=gen, dtype=F64)
    start = torch.cat([x0, torch.zeros_like(x0)], 1)
    x, y = residual.batch(pde=inner, initial=(start, torch.sin(math.pi * x0[:, 0])))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)).to(F64)
    return residual, model, x, y


def test_rows_are_scaled_by_the_root_weight_of_their_bin() -> None:
    causal = CausalWeights((0.0, 1.0), bins=4, epsilon=1.0)
    residual, model, x, y = _problem(causal)
    params = dict(model.named_parameters())
    plain = residual.rows(model, params, x, y).detach()
    causal.weights = torch.tensor([1.0, 0.25, 0.04, 0.0], dtype=F64)
    weighted = residual.rows(model, params, x, y).detach()
    pde = y[:, 0] == 0
    bins = causal.bin_of(x[:, 1]).long()
    scale = torch.where(pde, causal.weights[bins].sqrt(), torch.ones(len(x), dtype=F64))
    assert torch.allclose(weighted[:, 0], scale * plain[:, 0], rtol=1e-14, atol=0)
    assert bool((weighted[pde & (bins == 3)] == 0).all())


def test_update_gives_exp_of_the_earlier_bins_losses() -> None:
    causal = CausalWeights((0.0, 1.0), bins=4, epsilon=3.0)
    residual, model, x, y = _problem(causal)
    pde = y[:, 0] == 0
    r = residual.rows(model, dict(model.named_parameters()), x[pde], y[pde]).detach()[:, 0]
    w = causal.update(residual, model, x, y)
    bins = causal.bin_of(x[pde][:, 1]).long()
    loss = torch.stack([r[bins == k].pow(2).mean() for k in range(4)])
    expected = torch.exp(-3.0 * (torch.cumsum(loss, 0) - loss))
    assert w[0] == 1.0 and bool((w[1:] <= w[:-1]).all()) and float(w[-1]) < 1.0
    assert torch.allclose(w, expected, rtol=1e-12, atol=0)
    # The residual evaluated after the update is the weighted one again.
    after = residual.rows(model, dict(model.named_parameters()), x[pde], y[pde]).detach()[:, 0]
    assert torch.allclose(after, w[bins].sqrt() * r, rtol=1e-12, atol=0)


def test_the_forward_laplacian_serves_a_causally_weighted_group() -> None:
    causal = CausalWeights((0.0, 1.0), bins=4, epsilon=3.0)
    residual, model, x, y = _problem(causal)
    causal.update(residual, model, x, y)
    reference = JacobianEngine(Replicas(model, ["cpu"]), residual, mode="vmap").jacobian(x, y)
    engine = JacobianEngine(Replicas(model, ["cpu"]), residual)
    jac, res = engine.jacobian(x, y)
    assert engine.last_plan is not None and engine.last_plan.mode == "taylor"
    assert float((jac - reference[0]).abs().max()) <= 1e-10
    assert float((res - reference[1]).abs().max()) <= 1e-10


def test_bad_settings_and_an_unknown_group_are_refused() -> None:
    with pytest.raises(ValueError, match="t1 > t0"):
        CausalWeights((1.0, 1.0))
    causal = CausalWeights((0.0, 1.0), group="equation")
    residual, model, x, y = _problem(CausalWeights((0.0, 1.0)))
    with pytest.raises(ValueError, match="'equation'"):
        causal.update(residual, model, x, y)


def test_anneal_raises_epsilon_only_once_every_bin_is_fitted() -> None:
    schedule = (1e-2, 1e-1, 1.0, 10.0)
    causal = CausalWeights((0.0, 1.0), bins=4, epsilon=1e-2)
    causal.weights = torch.tensor([1.0, 0.999, 0.995, 0.98], dtype=F64)
    assert not causal.anneal(schedule) and causal.epsilon == 1e-2  # the last bin: 0.98 ≤ δ
    causal.weights = torch.tensor([1.0, 0.999, 0.995, 0.991], dtype=F64)
    assert causal.anneal(schedule) and causal.epsilon == 1e-1
    assert causal.anneal(schedule) and causal.epsilon == 1.0  # one value at a time
    causal.epsilon = 10.0
    assert not causal.anneal(schedule) and causal.epsilon == 10.0  # the schedule's end
