"""Looking into a model's parameters and a computation's tensors."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


def flat(model: nn.Module) -> torch.Tensor:
    """Every parameter of ``model``, detached, in one new vector (a copy, not a view)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


class LargestTensor(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records in ``largest`` the element count of the largest tensor any operation made."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out
