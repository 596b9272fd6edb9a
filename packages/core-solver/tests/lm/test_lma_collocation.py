"""LM with collocation points that move (``marquardt.jacobian.Collocation``): with fewer
rows than parameters, fixed points are interpolated and the error between them stalls;
refreshed points keep it falling. 1-D Poisson, −u'' = π² sin(πx), u(0) = u(1) = 0,
a 1-10-10-1 tanh network (P = 141) on 6 interior and 2 boundary rows."""

from __future__ import annotations

import math
import statistics

import torch
from torch import nn

from marquardt.jacobian import Collocation, PointResidual, ResidualGroup
from marquardt.solver import LMA

F64 = torch.float64
TEST = torch.linspace(0, 1, 201, dtype=F64)[:, None]


def _pde(u, x, _y):  # type: ignore[no-untyped-def]
    return -torch.func.hessian(u)(x).reshape(()) - math.pi**2 * torch.sin(math.pi * x[0])


def _boundary(u, x, _y):  # type: ignore[no-untyped-def]
    return u(x)


RESIDUAL = PointResidual(ResidualGroup("pde", _pde), ResidualGroup("boundary", _boundary))
SAMPLERS = {
    "pde": lambda n, g: torch.rand(n, 1, generator=g, dtype=F64),
    "boundary": lambda n, g: torch.randint(0, 2, (n, 1), generator=g).to(F64),
}


def _error(model: nn.Module) -> float:
    with torch.no_grad():
        exact = torch.sin(math.pi * TEST[:, 0])
        return float((model(TEST)[:, 0] - exact).norm() / exact.norm())


def _train(collocation_every: int, steps: int) -> tuple[list[float], float]:
    """The error every 10 steps, and the last loss."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(1, 10), nn.Tanh(), nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 1)
    ).double()
    assert sum(p.numel() for p in model.parameters()) == 141
    points = Collocation(RESIDUAL, SAMPLERS, {"pde": 6, "boundary": 2}, every=collocation_every)
    lma = LMA(model, ["cpu"], RESIDUAL)
    errors, loss = [], float("nan")
    for k, (x, y) in zip(range(steps), points, strict=False):
        assert x.shape[0] == 8
        loss, _ = lma.step(x, y)
        if k % 10 == 9:
            errors.append(_error(model))
    return errors, loss


def test_fixed_points_are_interpolated_and_refreshed_ones_keep_the_error_falling() -> None:
    fixed, fixed_loss = _train(collocation_every=10**9, steps=80)
    # Eight rows, 141 parameters: LM drives the loss to rounding and the error stalls.
    assert fixed_loss < 1e-20
    assert fixed[-1] > 0.05 and abs(fixed[-1] - fixed[-3]) < 0.05 * fixed[-1]
    moving, _ = _train(collocation_every=1, steps=150)
    early, late = statistics.median(moving[1:5]), statistics.median(moving[-5:])
    assert late < early / 3
    assert late < fixed[-1] / 30
