"""Per-sample Jacobian rows by plain reverse mode, one ``autograd.grad`` per residual.

Row ``(i, j)`` is ``∂r_ij/∂θ`` with sample ``i`` evaluated alone, the definition the
faster modes must reproduce. It costs ``b·m`` backward passes, so it serves only to check
the layer rules on a few samples; unlike ``vmap`` it needs no functorch transform, whose
first use imports ``torch._dynamo`` (about a second of start-up).
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from .._replicas import Replica
from ._common import ResidualFn, rows_of

__all__ = ["reference_jacobian"]


def reference_jacobian(
    replica: Replica, residual_fn: ResidualFn, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J, r)`` for the ``b`` samples of ``x``: ``J`` is ``(b·m) × P``."""
    rows: list[torch.Tensor] = []
    residuals: list[torch.Tensor] = []
    with torch.enable_grad():
        for i in range(int(x.shape[0])):
            flat = replica.flat.detach().requires_grad_(True)
            out = functional_call(replica.module, replica.param_dict(flat), (x[i : i + 1],))
            r = rows_of(residual_fn(out, y[i : i + 1]), 1).reshape(-1)
            for j in range(int(r.numel())):
                (grad,) = torch.autograd.grad(r[j], flat, retain_graph=True, allow_unused=True)
                rows.append(torch.zeros_like(flat) if grad is None else grad)
            residuals.append(r.detach())
    return torch.stack(rows), torch.cat(residuals)
