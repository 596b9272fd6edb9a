"""Elementwise activations as layers: `Sine`.

``torch`` has no layer for ``sin``; physics-informed networks for oscillatory solutions
use one (SIREN, Sitzmann et al. 2020), and the forward-Laplacian Jacobian mode
(``_modes._taylor``) recognises it by its type, as it recognises ``nn.Tanh``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Sine"]


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
