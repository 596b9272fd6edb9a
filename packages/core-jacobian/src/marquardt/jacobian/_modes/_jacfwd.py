"""Forward mode over parameter chunks: column block ``c`` of ``J`` is ``J·E_c``.

For a chunk of columns ``c`` (``E_c``: those columns of the identity), ``vmap`` over
``jvp`` pushes each basis tangent through the forward pass of a sub-batch of samples.
Intermediate memory is about ``columns × samples × activations``, so both are chunked
(``param_chunk`` columns, ``samples_per_call`` samples): forward mode over a whole
large slice at once is what blows memory and time, never done here.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from .._replicas import Replica
from ._common import (
    ModeCall,
    Primals,
    ResidualFn,
    Rows,
    forward_columns,
    rows_of,
    zero_padding_columns,
)

__all__ = ["jacfwd_jacobian"]


def jacfwd_jacobian(replica: Replica, residual_fn: ResidualFn, call: ModeCall) -> Rows:
    """``(J, r)`` for the ``b`` samples of ``call.x``: ``J`` is ``(b·m) × P``."""
    module = replica.module
    primals = Primals.of(replica, None)
    flat = primals.tensors[0]
    x, y, batch = call.x, call.y, call.batch
    step = max(1, min(call.samples_per_call, batch))
    jac_parts: list[torch.Tensor] = []
    res_parts: list[torch.Tensor] = []
    for lo in range(0, batch, step):
        xs, ys = x[lo : lo + step], y[lo : lo + step]
        b = xs.shape[0]

        def residuals(
            theta: torch.Tensor, xs: torch.Tensor = xs, ys: torch.Tensor = ys, b: int = b
        ) -> torch.Tensor:
            out = functional_call(module, replica.param_dict(theta), (xs,))
            return rows_of(residual_fn(out, ys), b).reshape(-1)

        with torch.no_grad():
            r = residuals(flat)
            block = torch.empty(r.numel(), primals.width, dtype=flat.dtype, device=flat.device)
            forward_columns(residuals, primals, block, call.param_chunk)
        jac_parts.append(block)
        res_parts.append(r)
    jac = jac_parts[0] if len(jac_parts) == 1 else torch.cat(jac_parts)
    zero_padding_columns(replica, None, jac)
    return jac, res_parts[0] if len(res_parts) == 1 else torch.cat(res_parts)
