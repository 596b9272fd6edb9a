"""`PinnStep`: the damped Gauss–Newton step of a `PointResidual` as one function, its
Jacobian against ``torch.func`` on the generic `PointModel`, the compiled step against the
eager one, and the eager fallback for a network the compiler cannot trace."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.func import jacrev

from marquardt.jacobian import (
    CompileFallbackWarning,
    FourierFeatures,
    PeriodicFeatures,
    PinnStep,
    PointResidual,
    ResidualGroup,
    Sine,
)
from marquardt.jacobian._modes._taylor import LAYERS


def _every_layer() -> nn.Sequential:
    """One network through every layer the forward Laplacian has a rule for."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [FourierFeatures(2, 3, seed=1), PeriodicFeatures(6, 0, 2.0, 2)]
    width = 9
    for act in (
        nn.Tanh(),
        Sine(1.5),
        nn.Sigmoid(),
        nn.SiLU(),
        nn.Softplus(beta=2.0),
        nn.GELU(),
        nn.Identity(),
    ):
        layers += [nn.Linear(width, 6), act]
        width = 6
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers).double()


def _residual() -> PointResidual:
    return PointResidual(
        ResidualGroup("pde", lambda u, x, y: -u.laplacian(x) + u(x) ** 3 - y),
        ResidualGroup("flux", lambda u, x, y: u.grad(x)[0] + u.hessian_diagonal(x)[1]),
        ResidualGroup("edge", lambda u, x, y: u(x) - y, 10.0),
    )


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.rand(10, 2, generator=g, dtype=torch.float64)
    edge = torch.rand(4, 2, generator=g, dtype=torch.float64)
    return _residual().batch(
        pde=(x, torch.sin(x[:, 0])),
        flux=torch.rand(4, 2, generator=g, dtype=torch.float64),
        edge=(edge, torch.zeros(4, dtype=torch.float64)),
    )


def test_the_network_holds_every_layer_with_a_rule() -> None:
    kinds = {type(m) for m in _every_layer()}
    assert set(LAYERS) <= kinds


def test_forward_laplacian_jacobian_equals_torch_func_on_every_layer() -> None:
    model, residual = _every_layer(), _residual()
    x, y = _batch()
    step = PinnStep(model, residual, x, y)
    assert step.forward_laplacian
    theta = step.theta()
    jac, r = step.jacobian(theta)
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    buffers = dict(model.named_buffers())

    def rows(th: torch.Tensor) -> torch.Tensor:
        parts = torch.split(th, [s.numel() for s in shapes])
        params = {n: p.reshape(s) for n, p, s in zip(names, parts, shapes, strict=True)}
        return residual.rows(model, {**buffers, **params}, x, y).reshape(-1)

    torch.testing.assert_close(r, rows(theta), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(jac, jacrev(rows)(theta), rtol=1e-10, atol=1e-10)


def test_the_step_solves_the_damped_system() -> None:
    model, residual = _every_layer(), _residual()
    x, y = _batch()
    step = PinnStep(model, residual, x, y)
    delta, loss = step.step(0.5)
    jac, r = step.jacobian(step.theta())
    a, g = jac.t() @ jac / r.numel(), jac.t() @ r / r.numel()
    lhs = (a + 0.5 * torch.diag(a.diagonal())) @ delta
    torch.testing.assert_close(lhs, g, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(loss, r @ r / r.numel())


def _compiled_against_eager(model: nn.Module, backend: bool | str) -> None:
    # One group asking u for its value, gradient and Laplacian: one graph to compile.
    residual = PointResidual(lambda u, x, y: -u.laplacian(x) + u.grad(x)[0] + u(x) ** 3 - y)
    g = torch.Generator().manual_seed(3)
    points = torch.rand(16, 2, generator=g, dtype=torch.float64)
    x, y = residual.batch(residual=(points, torch.ones(16, dtype=torch.float64)))
    eager = PinnStep(model, residual, x, y).step(1e-3)
    compiled = PinnStep(model, residual, x, y, compile=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        out = compiled.step(1e-3)
    assert compiled.compiled
    torch.testing.assert_close(out[0], eager[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out[1], eager[1], rtol=1e-10, atol=1e-12)


def test_traced_step_equals_eager_on_every_layer() -> None:
    # The whole graph traced through every layer's rule (dynamo and AOT autograd, whose
    # decompositions are what inductor compiles), without inductor's C++ build, which
    # takes minutes for a network this deep.
    _compiled_against_eager(_every_layer(), "aot_eager")


def test_compiled_step_equals_eager() -> None:
    # Inductor's kernels on a tanh network with a periodic first layer.
    torch.manual_seed(0)
    model = nn.Sequential(
        PeriodicFeatures(2, 0, 2.0, 2), nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)
    ).double()
    _compiled_against_eager(model, True)


class _Untraceable(nn.Module):
    """A layer the compiler cannot trace whole (a graph break in its forward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return torch.tanh(x)


def test_untraceable_network_runs_eagerly_with_one_warning() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 5), _Untraceable(), nn.Linear(5, 1)).double()
    residual = _residual()
    x, y = _batch()
    step = PinnStep(model, residual, x, y, compile=True)
    assert not step.forward_laplacian
    with pytest.warns(CompileFallbackWarning, match="could not trace") as caught:
        first = step.step(0.1)
        second = step.step(0.1)
    assert len(caught) == 1
    assert not step.compiled
    eager = PinnStep(model, residual, x, y).step(0.1)
    torch.testing.assert_close(first[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(second[0], eager[0], rtol=0, atol=0)
