"""The LMA that training scripts build in each process, on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Residual = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_lma(model: nn.Module, process_group: Any, residual_fn: Residual = torch.sub) -> Any:
    """An ``LMA`` over ``model`` on the CPU with residuals ``residual_fn(outputs, targets)``
    (by default outputs − targets), in ``process_group`` when there is one: the factory a
    ``Trainer`` calls after the rendezvous."""
    from marquardt.solver import LMA

    return LMA(model, [torch.device("cpu")], residual_fn=residual_fn, process_group=process_group)
