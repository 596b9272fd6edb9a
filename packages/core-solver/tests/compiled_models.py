"""Models the compiled-kernel tests compile, in a plain module (not rewritten by pytest) so
that a child process imports them with the same bytecode, and so the same kernel keys."""

from __future__ import annotations

from typing import Any

import torch


def spot(xy: torch.Tensor, a: Any, x0: Any, y0: Any, w: Any, b: Any) -> torch.Tensor:
    return a * torch.exp(-0.5 * ((xy[0] - x0) ** 2 + (xy[1] - y0) ** 2) / w**2) + b


def decay(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
    return a * torch.exp(-k * t)
