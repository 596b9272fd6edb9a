"""The forward Laplacian of the physics-informed layers, registered with the Jacobian
engine's (``_modes._taylor``): `Sine`, `FourierFeatures`, `PeriodicFeatures` in its
``LAYERS``, `HardBoundary` in its ``WRAPPERS``.

``FourierFeatures`` and ``PeriodicFeatures`` are a fixed linear map followed by ``cos``
and ``sin`` (the latter with its other inputs passed on), mapped by the chain rule; a
``HardBoundary`` combines its network's channels with those of ``φ`` and ``g`` by the
product rule. Importing this module registers them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .._modes._taylor import (
    LAYERS,
    WRAPPERS,
    Channels,
    Triple,
    Wrapper,
    cos_sin,
    elementwise,
    sinusoid,
)
from .activations import FourierFeatures, PeriodicFeatures, Sine
from .boundary import HardBoundary

__all__: list[str] = []


def _omega(m: nn.Module) -> float:
    assert isinstance(m, Sine)
    return m.omega


def _fourier(layer: nn.Module, z: Triple) -> Triple:
    assert isinstance(layer, FourierFeatures)
    b = (2 * torch.pi * layer.B).t().to(z[0].dtype)
    inner = (z[0] @ b, z[1] @ b, z[2] @ b)  # linear, no bias: every channel
    cos, sin = cos_sin(layer, inner)
    return (
        torch.cat([cos[0], sin[0]], -1),
        torch.cat([cos[1], sin[1]], -1),
        torch.cat([cos[2], sin[2]], -1),
    )


def _periodic(layer: nn.Module, z: Triple) -> Triple:
    assert isinstance(layer, PeriodicFeatures)
    b = (2 * torch.pi * layer.B).t().to(z[0].dtype)
    s = layer.S.to(z[0].dtype)
    inner = (z[0] @ b, z[1] @ b, z[2] @ b)
    cos, sin = cos_sin(layer, inner)
    return (
        torch.cat([cos[0], sin[0], z[0] @ s], -1),
        torch.cat([cos[1], sin[1], z[1] @ s], -1),
        torch.cat([cos[2], sin[2], z[2] @ s], -1),
    )


def _point_derivatives(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``f``, ``∂f/∂x_j`` and ``∂²f/∂x_j²`` of a parameter-free ``f`` of points at ``x``:
    ``(b,)``, ``(b, d)``, ``(b, d)``."""

    def one(xi: torch.Tensor) -> torch.Tensor:
        return fn(xi.unsqueeze(0)).reshape(())

    second = torch.func.vmap(torch.func.hessian(one))(x).diagonal(dim1=-2, dim2=-1)
    return fn(x).reshape(-1), torch.func.vmap(torch.func.jacrev(one))(x), second


def _hard_boundary(model: nn.Module, x: torch.Tensor, net: Channels) -> Channels:
    """The channels of ``g + φ·N`` from those of ``N`` by the product rule."""
    assert isinstance(model, HardBoundary)
    pv, pg, ph = (t.unsqueeze(1) for t in _point_derivatives(model.distance, x))
    nv, ng, nh = net.value, net.grad, net.second  # b × k, b × k × d, b × k × d
    value = pv * nv
    grad = pg * nv.unsqueeze(-1) + pv.unsqueeze(-1) * ng
    second = ph * nv.unsqueeze(-1) + 2 * pg * ng + pv.unsqueeze(-1) * nh
    if model.value is not None:
        gv, gg, gh = (t.unsqueeze(1) for t in _point_derivatives(model.value, x))
        value, grad, second = value + gv, grad + gg, second + gh
    return Channels(value=value, grad=grad, second=second, linears=net.linears)


def _inner(model: nn.Module) -> nn.Module:
    assert isinstance(model, HardBoundary)
    return model.net


LAYERS[Sine] = elementwise(sinusoid(_omega))
LAYERS[FourierFeatures] = _fourier
LAYERS[PeriodicFeatures] = _periodic
WRAPPERS[HardBoundary] = Wrapper(inner=_inner, combine=_hard_boundary)
