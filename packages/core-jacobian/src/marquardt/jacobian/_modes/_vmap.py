"""Per-sample ``vmap(jacrev)``: row block ``i`` is ``∂r_i/∂θ`` of sample ``i`` alone.

``torch.func.functional_call`` evaluates the replica with ``θ`` given as views of one flat
vector; ``jacrev`` differentiates sample ``i``'s ``m`` residuals in reverse mode (``m``
vector-Jacobian products) and ``vmap`` batches that over samples, in calls of at most
``samples_per_call`` samples so the intermediate memory stays within the budget.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from .._replicas import Replica
from ._common import ModeCall, ResidualFn, Rows, per_sample_jacrev, rows_of

__all__ = ["vmap_jacobian"]


def vmap_jacobian(replica: Replica, residual_fn: ResidualFn, call: ModeCall) -> Rows:
    """``(J, r)`` for the ``b`` samples of ``call.x``: ``J`` is ``(b·m) × P``."""
    module = replica.module

    def residual_of(flat: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(module, replica.param_dict(flat), (xi.unsqueeze(0),))
        return rows_of(residual_fn(out, yi.unsqueeze(0)), 1).reshape(-1)

    per_sample = per_sample_jacrev(residual_of, call.samples_per_call, call.batch)
    with torch.enable_grad():
        jac, res = per_sample(replica.flat.detach(), call.x, call.y)
    params = replica.flat.numel()
    return jac.reshape(-1, params), res.reshape(-1).detach()
