"""`PeriodicFeatures`: a network after it is periodic in the chosen input, values and
derivatives, to rounding; the forward Laplacian serves it and agrees with reverse mode."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.jacobian import (
    JacobianEngine,
    PeriodicFeatures,
    PointResidual,
    Replicas,
    ResidualGroup,
)

F64 = torch.float64


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        PeriodicFeatures(2, 0, 2.0, 4), nn.Linear(9, 12), nn.Tanh(), nn.Linear(12, 1)
    ).to(F64)


def _allen_cahn(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    v = u(p)
    return u.grad(p)[1] - 1e-4 * u.hessian_diagonal(p)[0] + 5 * (v**3 - v)


def _value(u: Any, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return u(x) - g


def test_the_network_is_periodic_in_its_axis_to_1e_12() -> None:
    model = _model().requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(64, 2, generator=g, dtype=F64) * 2 - 1
    shift = torch.tensor([2.0, 0.0], dtype=F64)
    for k in (1, -1, 3):
        assert float((model(x) - model(x + k * shift)).abs().max()) <= 1e-12
    # The slopes in x agree too (C¹ and beyond), unlike periodic rows that fit u alone.
    grad = torch.func.vmap(torch.func.jacrev(lambda p: model(p[None])[0, 0]))
    assert float((grad(x) - grad(x + shift)).abs().max()) <= 1e-12
    # Not periodic in the other input, nor with another period.
    assert float((model(x) - model(x + torch.tensor([0.0, 2.0], dtype=F64))).abs().max()) > 1e-3
    assert float((model(x) - model(x + torch.tensor([1.0, 0.0], dtype=F64))).abs().max()) > 1e-3


def test_the_features_are_harmonics_and_the_other_inputs() -> None:
    layer = PeriodicFeatures(3, 1, 0.5, 2)
    x = torch.rand(5, 3, dtype=F64)
    z = 2 * math.pi * torch.stack([x[:, 1] / 0.5, 2 * x[:, 1] / 0.5], -1)
    want = torch.cat([torch.cos(z), torch.sin(z), x[:, [0, 2]]], -1)
    assert float((layer(x) - want).abs().max()) <= 1e-14
    assert not list(layer.parameters())


def test_the_forward_laplacian_serves_it_as_reverse_mode_does() -> None:
    residual = PointResidual(ResidualGroup("pde", _allen_cahn), ResidualGroup("initial", _value))
    g = torch.Generator().manual_seed(3)
    inner = torch.rand(40, 2, generator=g, dtype=F64) * 2 - 1
    line = torch.cat([torch.rand(10, 1, generator=g, dtype=F64), torch.zeros(10, 1, dtype=F64)], 1)
    x, y = residual.batch(pde=inner, initial=(line, line[:, 0] ** 2))
    out = {}
    for mode in ("taylor", "vmap"):
        engine = JacobianEngine(Replicas(_model(), ["cpu"]), residual, mode=mode)
        out[mode] = engine.jacobian(x, y, slice_size=16)
    assert float((out["taylor"][0] - out["vmap"][0]).abs().max()) <= 1e-10
    assert float((out["taylor"][1] - out["vmap"][1]).abs().max()) <= 1e-10


@pytest.mark.parametrize(
    ("inputs", "axis", "period", "harmonics"), [(2, 2, 1.0, 3), (2, 0, 0.0, 3), (2, 0, 1.0, 0)]
)
def test_bad_arguments_are_refused(inputs: int, axis: int, period: float, harmonics: int) -> None:
    with pytest.raises(ValueError, match="PeriodicFeatures"):
        PeriodicFeatures(inputs, axis, period, harmonics)
