"""The ``taylor`` mode (forward Laplacian): the same ``J`` and residuals as per-point
reverse mode through ``torch.func.hessian`` on Poisson-, heat- and Helmholtz-like
residuals, for Linear stacks with tanh, sin, softplus, GELU, sigmoid and SiLU; chosen by
``auto`` where it applies, and passed by, with the reason, where it does not (other
layers, other models, residuals that transform ``u`` themselves)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.jacobian import (
    FourierFeatures,
    HardBoundary,
    JacobianEngine,
    PointResidual,
    Replicas,
    ResidualGroup,
    Sine,
)
from marquardt.jacobian._modes._forward_laplacian import fallbacks
from marquardt.jacobian._modes._taylor import taylor_support

F64 = torch.float64
Net = Callable[[], nn.Module]
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "tanh": nn.Tanh,
    "sin": lambda: Sine(2.0),
    "softplus": lambda: nn.Softplus(beta=2.0, threshold=1.0),
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU,
}


def _net(act: Callable[[], nn.Module], inputs: int = 2, outputs: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(inputs, 9), act(), nn.Linear(9, 7), act(), nn.Linear(7, outputs)
    ).to(F64)


# The same equations written both ways: derivatives asked of u, or by torch.func.
def _poisson(u: Any, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return -u.laplacian(x) - f


def _poisson_func(u: Any, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return -torch.func.hessian(u)(x).trace() - f


def _helmholtz(u: Any, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return u.laplacian(x) + 4.0 * u(x) - f


def _heat(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return u.grad(p)[1] - 0.4 * u.hessian_diagonal(p)[0] + u(p) * u.grad(p)[0]


def _heat_func(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    grad, hess = torch.func.jacrev(u)(p), torch.func.hessian(u)(p)
    return grad[1] - 0.4 * hess[0, 0] + u(p) * grad[0]


def _value(u: Any, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return u(x) - g


def _shifted(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return u(p) - u(p + torch.tensor([2.0, 0.0], dtype=p.dtype))


def _batch(residual: PointResidual, *names: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    points: dict[str, Any] = {}
    for i, name in enumerate(names):
        x = torch.rand(17 + 4 * i, 2, generator=gen, dtype=F64) * 2 - 1
        points[name] = (x, torch.sin(math.pi * x[:, 0]))
    return residual.batch(**points)


def _jacobians(
    model: nn.Module, residual: PointResidual, x: torch.Tensor, y: torch.Tensor, mode: str
) -> tuple[torch.Tensor, torch.Tensor, JacobianEngine]:
    engine = JacobianEngine(Replicas(model, ["cpu"]), residual, mode=mode, memory_budget=30_000)
    jac, res = engine.jacobian(x, y, slice_size=13)
    return jac, res, engine


EQUATIONS = {
    "poisson": (_poisson, _poisson_func),
    "helmholtz": (_helmholtz, _poisson_func),
    "heat": (_heat, _heat_func),
}


@pytest.mark.parametrize("equation", sorted(EQUATIONS))
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_forward_laplacian_gives_the_j_of_torch_func(equation: str, activation: str) -> None:
    fast_fn, _ = EQUATIONS[equation]
    residual = PointResidual(ResidualGroup("pde", fast_fn), ResidualGroup("bc", _value, 3.0))
    x, y = _batch(residual, "pde", "bc")
    j_ref, r_ref, _ = _jacobians(_net(ACTIVATIONS[activation]), residual, x, y, "vmap")
    jac, res, engine = _jacobians(_net(ACTIVATIONS[activation]), residual, x, y, "auto")
    assert engine.last_plan is not None and engine.last_plan.mode == "taylor"
    assert engine.last_plan.samples_per_chunk < 13  # several chunks per slice
    assert float(j_ref.abs().max()) > 0.1
    assert float((jac - j_ref).abs().max()) <= 1e-10
    assert float((res - r_ref).abs().max()) <= 1e-10
    assert not fallbacks(residual)
    # The loss (the step's trial forward) from the forward pass alone.
    assert engine.loss(x, y) == pytest.approx(float(r_ref @ r_ref) / len(r_ref), rel=1e-12)


def test_derivatives_asked_of_u_equal_those_of_torch_func() -> None:
    # The generic path (mode vmap) computes u.laplacian and u.grad by torch.func itself.
    model = _net(nn.Tanh)
    fast = PointResidual(ResidualGroup("pde", _heat))
    func = PointResidual(ResidualGroup("pde", _heat_func))
    x, y = _batch(fast, "pde")
    j_fast, r_fast, _ = _jacobians(model, fast, x, y, "vmap")
    j_func, r_func, _ = _jacobians(model, func, x, y, "vmap")
    assert float((j_fast - j_func).abs().max()) <= 1e-12
    assert float((r_fast - r_func).abs().max()) <= 1e-12


def test_several_outputs_and_rows_per_point() -> None:
    def system(u: Any, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        # Two fields, three rows per point: Δu₀ − f, ∂u₁/∂x₀ − u₀, u₁·Δu₁.
        lap, grad = u.laplacian(x), u.grad(x)
        return torch.stack([lap[0] - f, grad[1, 0] - u(x)[0], u(x)[1] * lap[1]])

    residual = PointResidual(system)
    x, y = _batch(residual, "residual")
    j_ref, r_ref, _ = _jacobians(_net(nn.Tanh, outputs=2), residual, x, y, "vmap")
    jac, res, engine = _jacobians(_net(nn.Tanh, outputs=2), residual, x, y, "taylor")
    assert engine.last_plan is not None and engine.last_plan.mode == "taylor"
    assert jac.shape == (3 * int(x.shape[0]), j_ref.shape[1])
    assert float((jac - j_ref).abs().max()) <= 1e-10
    assert float((res - r_ref).abs().max()) <= 1e-10


def test_parameter_subset_columns_equal_the_generic_ones() -> None:
    residual = PointResidual(ResidualGroup("pde", _heat), ResidualGroup("bc", _value))
    x, y = _batch(residual, "pde", "bc")
    j_ref, _, _ = _jacobians(_net(nn.Tanh), residual, x, y, "vmap")
    engine = JacobianEngine(Replicas(_net(nn.Tanh), ["cpu"]), residual, mode="taylor")
    index = [0, 5, 17, 30, 40, 71, int(j_ref.shape[1]) - 1]
    batch = engine.prepare(x, y, 11, strategy="explicit", columns=engine.columns(index))
    jac = torch.cat([p.jacobian for p in engine.jacobian_slices(batch)])
    assert float((jac - j_ref[:, index]).abs().max()) <= 1e-10


class _Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net(nn.Tanh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


MODELS_PASSED_BY: dict[str, tuple[Net, str]] = {
    "relu": (lambda: _net(nn.ReLU), "ReLU has no forward-Laplacian rule"),
    "gelu_tanh": (lambda: _net(lambda: nn.GELU("tanh")), "approximate='tanh'"),
    "custom module": (_Custom, "not an nn.Sequential"),
    "shared weights": (
        lambda: nn.Sequential(
            *(lambda lin: [nn.Linear(2, 4), nn.Tanh(), lin, nn.Tanh(), lin])(nn.Linear(4, 4)),
            nn.Tanh(),
            nn.Linear(4, 1),
        ).to(F64),
        "used twice",
    ),
    "layer norm": (
        lambda: nn.Sequential(nn.Linear(2, 4), nn.LayerNorm(4), nn.Tanh(), nn.Linear(4, 1)).to(F64),
        "LayerNorm has no forward-Laplacian rule",
    ),
}


@pytest.mark.parametrize("kind", sorted(MODELS_PASSED_BY))
def test_other_models_fall_back_to_vmap_with_the_reason(kind: str) -> None:
    build, why = MODELS_PASSED_BY[kind]
    residual = PointResidual(ResidualGroup("pde", _helmholtz), ResidualGroup("bc", _value))
    x, y = _batch(residual, "pde", "bc")
    model = build()
    if kind == "relu":  # ReLU under a Laplacian is refused on every path: check the plan only
        ok, reason = taylor_support(model)
        assert not ok and why in reason
        return
    torch.manual_seed(0)
    j_ref, _, _ = _jacobians(build(), residual, x, y, "vmap")
    for mode in ("auto", "taylor"):
        torch.manual_seed(0)
        jac, _, engine = _jacobians(build(), residual, x, y, mode)
        assert engine.last_plan is not None and engine.last_plan.mode == "vmap"
        assert why in engine.last_plan.reason
        assert float((jac - j_ref).abs().max()) <= 1e-10


def test_residuals_that_transform_u_themselves_fall_back_per_group() -> None:
    model = _net(nn.Tanh)
    # Every group through torch.func: the whole residual goes to vmap, saying why.
    func = PointResidual(ResidualGroup("pde", _poisson_func))
    x, y = _batch(func, "pde")
    _, _, engine = _jacobians(model, func, x, y, "auto")
    assert engine.last_plan is not None and engine.last_plan.mode == "vmap"
    assert "u.laplacian(x)" in engine.last_plan.reason
    assert "torch.func" in engine.last_plan.reason
    # Mixed: the groups that ask u keep the fast path, the others go to reverse mode.
    mixed = PointResidual(
        ResidualGroup("pde", _poisson),
        ResidualGroup("periodic", _shifted),
        ResidualGroup("heat", _heat_func),
    )
    x, y = _batch(mixed, "pde", "periodic", "heat")
    j_ref, r_ref, _ = _jacobians(model, mixed, x, y, "vmap")
    jac, res, engine = _jacobians(model, mixed, x, y, "auto")
    assert engine.last_plan is not None and engine.last_plan.mode == "taylor"
    assert sorted(fallbacks(mixed)) == ["heat", "periodic"]
    assert "another tensor than its point" in fallbacks(mixed)["periodic"]
    assert float((jac - j_ref).abs().max()) <= 1e-10
    assert float((res - r_ref).abs().max()) <= 1e-10


@pytest.mark.parametrize("mode", ["taylor", "vmap"])
def test_shuffled_points_written_in_place_keep_their_order(mode: str) -> None:
    # fill_jacobian hands the mode the rows of J to write: interleaved groups are sorted
    # for the work and must land back in the points' order there.
    residual = PointResidual(ResidualGroup("pde", _heat), ResidualGroup("bc", _value))
    x, y = _batch(residual, "pde", "bc")
    perm = torch.randperm(int(x.shape[0]), generator=torch.Generator().manual_seed(1))
    x, y = x[perm], y[perm]
    j_ref, r_ref, _ = _jacobians(_net(nn.Tanh), residual, x, y, "vmap")
    engine = JacobianEngine(Replicas(_net(nn.Tanh), ["cpu"]), residual, mode=mode)
    batch = engine.prepare(x, y, 9, strategy="explicit")
    jac, res = torch.full_like(j_ref, math.nan), torch.full_like(r_ref, math.nan)
    engine.fill_jacobian(batch, jac, res)
    assert float((jac - j_ref).abs().max()) <= 1e-10
    assert float((res - r_ref).abs().max()) <= 1e-10


def test_fourier_features_are_fixed_cosines_and_sines_that_taylor_maps() -> None:
    layer = FourierFeatures(2, 5, scale=2.0, seed=4).to(F64)
    x = torch.rand(7, 2, dtype=F64)
    z = 2 * math.pi * x @ layer.B.t()
    assert torch.equal(layer(x), torch.cat([torch.cos(z), torch.sin(z)], -1))
    assert not list(layer.parameters())  # B is a buffer: never trained, no columns of J
    torch.manual_seed(0)
    model = nn.Sequential(layer, nn.Linear(10, 9), nn.Tanh(), nn.Linear(9, 1)).to(F64)
    residual = PointResidual(ResidualGroup("pde", _heat), ResidualGroup("bc", _value))
    x, y = _batch(residual, "pde", "bc")
    j_ref, r_ref, _ = _jacobians(model, residual, x, y, "vmap")
    jac, res, engine = _jacobians(model, residual, x, y, "auto")
    assert engine.last_plan is not None and engine.last_plan.mode == "taylor"
    assert float((jac - j_ref).abs().max()) <= 1e-10
    assert float((res - r_ref).abs().max()) <= 1e-10


def _square_distance(x: torch.Tensor) -> torch.Tensor:
    return (1 - x[:, 0] ** 2) * (1 - x[:, 1] ** 2)  # zero on the edge of [-1, 1]²


def _edge_value(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x[:, 0]) * x[:, 1]


def test_hard_boundary_holds_the_boundary_values_and_taylor_serves_it() -> None:
    model = HardBoundary(_net(nn.Tanh), _square_distance, _edge_value)
    edge = torch.tensor([[-1.0, 0.3], [1.0, -0.7], [0.2, 1.0], [-0.4, -1.0]], dtype=F64)
    with torch.no_grad():
        assert torch.allclose(model(edge)[:, 0], _edge_value(edge), atol=1e-15, rtol=0)
    residual = PointResidual(ResidualGroup("pde", _heat))  # no boundary group needed
    x, y = _batch(residual, "pde")
    j_ref, r_ref, _ = _jacobians(model, residual, x, y, "vmap")
    jac, res, engine = _jacobians(model, residual, x, y, "auto")
    assert engine.last_plan is not None and engine.last_plan.mode == "taylor"
    assert float((jac - j_ref).abs().max()) <= 1e-10
    assert float((res - r_ref).abs().max()) <= 1e-10
    zero_g = HardBoundary(_net(nn.Tanh), _square_distance)
    j_ref, _, _ = _jacobians(zero_g, residual, x, y, "vmap")
    jac, _, _ = _jacobians(zero_g, residual, x, y, "taylor")
    assert float((jac - j_ref).abs().max()) <= 1e-10
    ok, why = taylor_support(HardBoundary(_net(nn.ReLU), _square_distance))
    assert not ok and "inside HardBoundary" in why and "ReLU" in why
