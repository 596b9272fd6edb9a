"""Layers of physics-informed networks that torch lacks: `Sine`, `FourierFeatures`,
`PeriodicFeatures`.

``torch`` has no layer for ``sin``; networks for oscillatory solutions use one (SIREN,
Sitzmann et al. 2020), or map their inputs to random Fourier features first (Tancik et
al. 2020; for PINNs, Wang, Wang & Perdikaris 2021, "On the eigenvector bias of Fourier
feature networks", CMAME 384), which lets a small network represent high frequencies.
A solution periodic in one input is represented exactly periodic by a network whose first
layer maps that input to the harmonics of its period (Dong & Ni 2021, "A method for
representing periodic functions and enforcing exactly periodic boundary conditions with
deep neural networks", J. Comput. Phys. 435): `PeriodicFeatures`. The forward-Laplacian
Jacobian mode (``_modes._taylor``) recognises these layers by their type, as it
recognises ``nn.Tanh``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._errors import message

__all__ = ["FourierFeatures", "PeriodicFeatures", "Sine"]


class Sine(nn.Module):
    """``sin(ω·x)`` elementwise.

    Arguments:
        omega: the frequency ``ω`` (1 by default; SIREN's first layer uses 30).
    """

    def __init__(self, omega: float = 1.0) -> None:
        super().__init__()
        self.omega = float(omega)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``sin(ω·x)``.

        Arguments:
            x: any tensor.

        Returns:
            ``sin(ω·x)``, of the shape of ``x``.
        """
        return torch.sin(self.omega * x)

    def extra_repr(self) -> str:
        return f"omega={self.omega:g}"


class FourierFeatures(nn.Module):
    """``[cos(2π·B x), sin(2π·B x)]``: ``2·features`` outputs of ``inputs`` inputs, with a
    fixed random ``B`` (``features × inputs``, entries drawn from ``N(0, scale²)``; a
    buffer, never trained).

    Put it first in an ``nn.Sequential``: ``Sequential(FourierFeatures(2, 32, 1.0),
    Linear(64, 30), Tanh(), ...)``. ``scale`` sets the frequencies the network represents
    readily: about the solution's highest frequency (in cycles per unit of ``x``).

    Arguments:
        inputs: ``d``, the inputs of a point.
        features: the number of frequencies (rows of ``B``).
        scale: the standard deviation of the entries of ``B``.
        seed: the seed of ``B``'s draw.
    """

    B: torch.Tensor

    def __init__(self, inputs: int, features: int, scale: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("B", scale * torch.randn(features, inputs, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The features of the points ``x``.

        Arguments:
            x: ``(..., inputs)``.

        Returns:
            ``(..., 2·features)``: the cosines, then the sines.
        """
        z = 2 * math.pi * x @ self.B.t()
        return torch.cat([torch.cos(z), torch.sin(z)], -1)


class PeriodicFeatures(nn.Module):
    """``[cos(2πk·x_a/L), sin(2πk·x_a/L) for k = 1..K, the other inputs]``: input ``a``
    mapped to ``K`` harmonics of the period ``L``, the other inputs passed on, so that any
    network after it is periodic in ``x_a`` with period ``L`` (to rounding), its
    derivatives included; no periodic rows are needed.

    Put it first in an ``nn.Sequential``: ``Sequential(PeriodicFeatures(2, 0, 2.0, 8),
    Linear(17, 20), Tanh(), ...)`` (``2K + inputs − 1`` outputs). Its maps are buffers,
    never trained.

    Arguments:
        inputs: ``d``, the inputs of a point.
        axis: ``a``, the periodic input.
        period: ``L``.
        harmonics: ``K``, the number of harmonics (the constant is the next layer's bias).

    Raises:
        ValueError: ``axis`` outside ``[0, inputs)``, ``period`` not positive or
            ``harmonics`` below 1.
    """

    B: torch.Tensor
    S: torch.Tensor

    def __init__(self, inputs: int, axis: int, period: float, harmonics: int) -> None:
        super().__init__()
        if not 0 <= axis < inputs or not period > 0 or harmonics < 1:
            raise ValueError(
                message(
                    "PeriodicFeatures(inputs, axis, period, harmonics) with 0 ≤ axis < inputs, "
                    "period > 0 and harmonics ≥ 1 was expected",
                    f"got inputs={inputs}, axis={axis}, period={period}, harmonics={harmonics}",
                    "name the periodic input by its index and give its period",
                )
            )
        self.axis, self.period, self.harmonics = axis, float(period), harmonics
        b = torch.zeros(harmonics, inputs, dtype=torch.float64)
        b[:, axis] = torch.arange(1, harmonics + 1, dtype=torch.float64) / self.period
        keep = [i for i in range(inputs) if i != axis]
        self.register_buffer("B", b)
        self.register_buffer("S", torch.eye(inputs, dtype=torch.float64)[:, keep])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The features of the points ``x``.

        Arguments:
            x: ``(..., inputs)``.

        Returns:
            ``(..., 2·harmonics + inputs − 1)``: the cosines, the sines, the other inputs.
        """
        z = 2 * math.pi * x @ self.B.t().to(x.dtype)
        return torch.cat([torch.cos(z), torch.sin(z), x @ self.S.to(x.dtype)], -1)

    def extra_repr(self) -> str:
        return f"axis={self.axis}, period={self.period:g}, harmonics={self.harmonics}"
