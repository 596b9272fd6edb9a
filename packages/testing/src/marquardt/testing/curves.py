"""The curve the curve-fitting tests fit most, and the call that returns (popt, pcov)."""

from __future__ import annotations

from typing import Any

import torch


def decay(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """y = a·exp(−b·x) + c."""
    return a * torch.exp(-b * x) + c


def popt_pcov(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(popt, pcov) of the sliced engine (``marquardt.solver.curve_fit_result``)."""
    from marquardt.solver import curve_fit_result

    result = curve_fit_result(*args, **kwargs)
    return result.popt, result.pcov
