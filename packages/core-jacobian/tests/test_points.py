"""Residuals that differentiate the model by its inputs (``PointResidual``): the engine's J
against ``torch.autograd.functional.jacobian`` of the same residual, every mode, both
strategies, parameter subsets; the refusals (ReLU under a Laplacian, wrong dtype, targets
not built by ``batch``); the planner's accounting of the input-derivative graph."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from marquardt.jacobian import (
    JacobianEngine,
    ParameterDtypeError,
    PointResidual,
    Replicas,
    ResidualGroup,
    ResidualNotDifferentiableError,
    ResidualShapeError,
)

MODES = ("auto", "vmap", "jacfwd", "layers", "broadcast", "taylor")


def _net(activation: type[nn.Module] = nn.Tanh, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(2, 8), activation(), nn.Linear(8, 8), activation(), nn.Linear(8, 1)
    ).to(dtype)


def _pde(u, x, f):  # type: ignore[no-untyped-def]
    return -torch.func.hessian(u)(x).trace() - f


def _boundary(u, x, g):  # type: ignore[no-untyped-def]
    return u(x) - g


def _flux(u, x, y):  # type: ignore[no-untyped-def]
    # First derivatives, a vector residual would need m > 1: keep m = 1 but use ∇u.
    grad = torch.func.jacrev(u)(x)
    return grad.sum() - y.sum()


def _residual() -> PointResidual:
    return PointResidual(
        ResidualGroup("pde", _pde),
        ResidualGroup("boundary", _boundary, weight=10.0),
        ResidualGroup("flux", _flux, weight=0.5),
    )


def _batch(residual: PointResidual) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    inner = torch.rand(23, 2, generator=gen, dtype=torch.float64)
    edge = torch.rand(9, 2, generator=gen, dtype=torch.float64)
    edge[:, 0] = 0.0
    flux = torch.rand(6, 2, generator=gen, dtype=torch.float64)
    f = 2 * math.pi**2 * torch.sin(math.pi * inner[:, 0]) * torch.sin(math.pi * inner[:, 1])
    return residual.batch(
        pde=(inner, f),
        boundary=(edge, torch.zeros(9)),
        flux=(flux, torch.ones(6, 2, dtype=torch.float64)),
    )


def _reference(
    replicas: Replicas, residual: PointResidual, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    replica = replicas[0]

    def rows(theta: torch.Tensor) -> torch.Tensor:
        return residual.rows(replica.module, replica.param_dict(theta), x, y).reshape(-1)

    theta = replica.flat.detach().clone()
    return torch.autograd.functional.jacobian(rows, theta), rows(theta).detach()


@dataclass(frozen=True)
class Pinn:
    """The shared problem: the residual, its replicas, its batch and their reference J, r."""

    residual: PointResidual
    replicas: Replicas
    x: torch.Tensor
    y: torch.Tensor
    j_ref: torch.Tensor
    r_ref: torch.Tensor


@pytest.fixture
def pinn() -> Pinn:
    residual = _residual()
    replicas = Replicas(_net(), ["cpu"])
    x, y = _batch(residual)
    return Pinn(residual, replicas, x, y, *_reference(replicas, residual, x, y))


@pytest.mark.parametrize("mode", MODES)
def test_explicit_j_equals_autograd_jacobian(mode: str, pinn: Pinn) -> None:
    # A small budget: several slices and several chunks per slice, groups cut across them.
    engine = JacobianEngine(pinn.replicas, pinn.residual, mode=mode, memory_budget=40_000)
    jac, res = engine.jacobian(pinn.x, pinn.y, slice_size=10)
    assert engine.last_plan is not None
    assert engine.last_plan.mode in ("vmap", "jacfwd", "taylor")
    assert engine.last_plan.samples_per_chunk < 10
    assert jac.shape == pinn.j_ref.shape == (38, pinn.replicas.num_params)
    assert float((jac - pinn.j_ref).abs().max()) <= 1e-10
    assert float((res - pinn.r_ref).abs().max()) <= 1e-10
    assert float(pinn.j_ref.abs().max()) > 1.0  # the rows through Δu are not trivially zero


@pytest.mark.parametrize("mode", MODES)
def test_accumulated_products_equal_autograd_jacobian(mode: str, pinn: Pinn) -> None:
    j_ref, r_ref, x, y = pinn.j_ref, pinn.r_ref, pinn.x, pinn.y
    engine = JacobianEngine(pinn.replicas, pinn.residual, mode=mode, memory_budget=40_000)
    products = engine.accumulate(x, y, slice_size=7)
    scale = float((j_ref.T @ j_ref).abs().max())
    assert float((products.jtj - j_ref.T @ j_ref).abs().max()) <= 1e-10 * scale
    assert float((products.jtr - j_ref.T @ r_ref).abs().max()) <= 1e-10 * scale
    assert products.rss == pytest.approx(float(r_ref @ r_ref), rel=1e-12)
    assert engine.loss(x, y) == pytest.approx(float(r_ref @ r_ref) / 38, rel=1e-12)


@pytest.mark.parametrize("mode", ["vmap", "jacfwd"])
def test_subset_columns_equal_autograd_jacobian(mode: str, pinn: Pinn) -> None:
    replicas, residual, x, y, j_ref = pinn.replicas, pinn.residual, pinn.x, pinn.y, pinn.j_ref
    engine = JacobianEngine(replicas, residual, mode=mode)
    index = [0, 5, 17, 30, 40, 71, replicas.num_params - 1]
    cols = engine.columns(index)
    batch = engine.prepare(x, y, 11, strategy="explicit", columns=cols)
    parts = list(engine.jacobian_slices(batch))
    jac = torch.cat([p.jacobian for p in parts])
    assert float((jac - j_ref[:, index]).abs().max()) <= 1e-10


@pytest.mark.parametrize("mode", ["vmap", "jacfwd"])
def test_shuffled_points_give_the_rows_in_their_order(mode: str) -> None:
    residual = _residual()
    replicas = Replicas(_net(), ["cpu"])
    x, y = _batch(residual)
    perm = torch.randperm(int(x.shape[0]), generator=torch.Generator().manual_seed(5))
    xs, ys = x[perm], y[perm]
    j_ref, r_ref = _reference(replicas, residual, x, y)
    engine = JacobianEngine(replicas, residual, mode=mode, memory_budget=40_000)
    jac, res = engine.jacobian(xs, ys, slice_size=10)
    assert float((jac - j_ref[perm]).abs().max()) <= 1e-10
    assert float((res - r_ref[perm]).abs().max()) <= 1e-10
    assert engine.loss(xs, ys) == pytest.approx(float(r_ref @ r_ref) / 38, rel=1e-12)


def test_the_batch_carries_everything_a_slice_needs() -> None:
    # Built by one PointResidual, evaluated by another of the same groups (as each rank of
    # a process group builds its own): the targets' shapes travel with the batch.
    x, y = _batch(_residual())
    replicas = Replicas(_net(), ["cpu"])
    j_ref, _ = _reference(replicas, _residual(), x, y)
    jac, _ = JacobianEngine(replicas, _residual()).jacobian(x, y)
    assert float((jac - j_ref).abs().max()) <= 1e-10
    assert y.shape == (38, 4)  # group, target shape, the widest target (flux: 2 values)
    assert y[:23, 1].eq(-1).all() and y[32:, 1].eq(2).all()


def test_layers_and_broadcast_are_never_chosen_and_say_why() -> None:
    residual = _residual()
    engine = JacobianEngine(Replicas(_net(), ["cpu"]), residual, mode="layers")
    x, y = _batch(residual)
    plan = engine.plan(x, y)
    assert plan.mode == "vmap"
    assert "differentiates the model by its inputs" in plan.reason


def test_the_planner_counts_the_input_derivative_graph() -> None:
    residual = _residual()
    replicas = Replicas(_net(), ["cpu"])
    x, y = _batch(residual)
    budget = 200_000
    points = JacobianEngine(replicas, residual, mode="vmap", memory_budget=budget)
    outputs = JacobianEngine(
        replicas, lambda a, b: a[:, 0] - b[:, 0], mode="vmap", memory_budget=budget
    )
    plan_points = points.plan(x, y)
    plan_outputs = outputs.plan(x, y)
    assert "input-derivative graph: 6×" in plan_points.reason  # 2·(d + 1), d = 2
    assert plan_points.samples_per_chunk < plan_outputs.samples_per_chunk


def test_resampled_points_give_the_new_points_jacobian() -> None:
    residual = _residual()
    replicas = Replicas(_net(), ["cpu"])
    engine = JacobianEngine(replicas, residual)
    x, y = _batch(residual)
    engine.jacobian(x, y)
    x2 = x.flip(1).clone()
    y2 = y.clone()
    j_ref, _ = _reference(replicas, residual, x2, y2)
    jac, _ = engine.jacobian(x2, y2)
    assert float((jac - j_ref).abs().max()) <= 1e-10


def test_a_relu_network_under_a_laplacian_is_refused_with_a_hint() -> None:
    residual = _residual()
    engine = JacobianEngine(Replicas(_net(nn.ReLU), ["cpu"]), residual)
    x, y = _batch(residual)
    with pytest.raises(ResidualNotDifferentiableError) as err:
        engine.accumulate(x, y)
    text = str(err.value)
    found = text.split("HINT")[0]
    assert "'pde'" in found and "piecewise-linear" in found and "1 (ReLU)" in found
    assert "HINT: use a smooth activation" in text


def test_a_relu_network_with_first_derivatives_only_is_served() -> None:
    residual = PointResidual(ResidualGroup("boundary", _boundary))
    engine = JacobianEngine(Replicas(_net(nn.ReLU), ["cpu"]), residual)
    x, y = residual.batch(boundary=(torch.rand(5, 2, dtype=torch.float64), torch.zeros(5)))
    jac, _ = engine.jacobian(x, y)
    assert jac.shape[0] == 5


def test_a_float32_model_is_refused_unless_asked_for() -> None:
    with pytest.raises(ParameterDtypeError, match=r"HINT: call model\.to"):
        JacobianEngine(Replicas(_net(dtype=torch.float32), ["cpu"]), _residual())
    single = PointResidual(ResidualGroup("pde", _pde), dtype=torch.float32)
    JacobianEngine(Replicas(_net(dtype=torch.float32), ["cpu"]), single)


def test_targets_not_built_by_batch_are_refused() -> None:
    engine = JacobianEngine(Replicas(_net(), ["cpu"]), _residual())
    x = torch.rand(6, 2, dtype=torch.float64)
    with pytest.raises(ResidualShapeError, match=r"PointResidual\.batch"):
        engine.jacobian(x, torch.full((6, 1), 7.0, dtype=torch.float64))


def test_batch_checks_group_names_and_lengths() -> None:
    residual = _residual()
    with pytest.raises(ValueError, match="name each keyword"):
        residual.batch(interior=torch.rand(3, 2))
    with pytest.raises(ValueError, match="one target per point"):
        residual.batch(pde=(torch.rand(3, 2), torch.rand(4)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# The reference (torch.autograd.functional) runs its backward pass on autograd's own CUDA
# thread, where PyTorch warns once that it sets the device's primary context for cuBLAS.
@pytest.mark.filterwarnings(
    "ignore:Attempting to run cuBLAS, but there was no current CUDA context"
)
def test_gpu_j_equals_autograd_jacobian() -> None:
    residual = _residual()
    replicas = Replicas(_net().cuda(), ["cuda:0"])
    x, y = _batch(residual)
    j_ref, _ = _reference(replicas, residual, x.cuda(), y.cuda())
    for mode in ("vmap", "jacfwd"):
        engine = JacobianEngine(replicas, residual, mode=mode)
        jac, _ = engine.jacobian(x, y, slice_size=10)
        assert float((jac - j_ref).abs().max()) <= 1e-10
        products = engine.accumulate(x, y)
        assert float((products.jtj - j_ref.T @ j_ref).abs().max()) <= 1e-9


def test_runs_are_the_consecutive_points_of_one_group_and_code() -> None:
    residual = PointResidual(ResidualGroup("pde", _pde), ResidualGroup("boundary", _boundary))
    targets = torch.tensor(
        [[0, 0, 1.0], [0, 0, 2.0], [1, 0, 3.0], [1, 2, 4.0], [1, 2, 5.0], [0, 0, 6.0]],
        dtype=torch.float64,
    )
    assert list(residual.runs(targets)) == [(0, 0, 0, 2), (1, 0, 2, 3), (1, 2, 3, 5), (0, 0, 5, 6)]
    assert list(residual.runs(targets[:1])) == [(0, 0, 0, 1)]
    assert list(residual.runs(targets[:0])) == []
