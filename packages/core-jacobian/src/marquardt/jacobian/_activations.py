"""Layers of physics-informed networks that torch lacks: `Sine`, `FourierFeatures`.

``torch`` has no layer for ``sin``; networks for oscillatory solutions use one (SIREN,
Sitzmann et al. 2020), or map their inputs to random Fourier features first (Tancik et
al. 2020; for PINNs, Wang, Wang & Perdikaris 2021, "On the eigenvector bias of Fourier
feature networks", CMAME 384), which lets a small network represent high frequencies.
The forward-Laplacian Jacobian mode (``_modes._taylor``) recognises both by their type,
as it recognises ``nn.Tanh``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["FourierFeatures", "Sine"]


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
