"""Dirichlet conditions built into the network: `HardBoundary`.

A boundary group's rows ask the fit to make ``u = g`` on ``∂Ω``, weighed against the
equation's rows. Writing the network as

    u(x) = g(x) + φ(x)·N(x)

with ``φ`` zero on ``∂Ω`` and positive inside (a distance function) and ``g`` any smooth
extension of the boundary values makes ``u = g`` hold exactly for every parameter, so the
fit has the equation alone to satisfy and no weight to choose (Lagaris, Likas & Fotiadis
1998; Sukumar & Srivastava 2022, "Exact imposition of boundary conditions with distance
functions in physics-informed deep neural networks", CMAME 389).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["HardBoundary"]

#: A function of points ``(b, d)`` returning one value per point, ``(b,)``.
PointsFn = Callable[[torch.Tensor], torch.Tensor]


class HardBoundary(nn.Module):
    """``u(x) = g(x) + φ(x)·N(x)``: the network ``N`` with Dirichlet values ``g`` on the
    zero set of ``φ`` built in.

    The forward-Laplacian Jacobian mode serves it when ``N`` is a network it serves
    (``φ`` and ``g`` hold no parameters; their derivatives are taken by ``torch.func``).

    Arguments:
        net: ``N``, the network (points ``(b, d)`` to ``(b, k)``).
        distance: ``φ``, points ``(b, d)`` to ``(b,)``: zero on the boundary, positive
            inside, smooth (e.g. ``x₀(1 − x₀)·x₁(1 − x₁)`` on the unit square).
        value: ``g``, points ``(b, d)`` to ``(b,)``, the boundary values extended inside;
            None for ``g = 0``.
    """

    def __init__(self, net: nn.Module, distance: PointsFn, value: PointsFn | None = None):
        super().__init__()
        self.net = net
        self.distance = distance
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``g(x) + φ(x)·N(x)`` at the points ``x``.

        Arguments:
            x: ``(b, d)``.

        Returns:
            ``(b, k)``, as ``N``.
        """
        out: torch.Tensor = self.distance(x).unsqueeze(-1) * self.net(x)
        if self.value is not None:
            out = out + self.value(x).unsqueeze(-1)
        return out
