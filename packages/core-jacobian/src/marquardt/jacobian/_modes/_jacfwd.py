"""Forward mode over parameter chunks: column block ``c`` of ``J`` is ``J·E_c``.

For a chunk of columns ``c`` (``E_c``: those columns of the identity), ``vmap`` over
``jvp`` pushes each basis tangent through the forward pass of a sub-batch of samples.
Intermediate memory is about ``columns × samples × activations``, so both are chunked
(``param_chunk`` columns, ``samples_per_call`` samples): forward mode over a whole
large slice at once is what blows memory and time, never done here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import functional_call, jvp, vmap

from .._replicas import Replica
from ._common import ResidualFn, rows_of

__all__ = ["jacfwd_jacobian"]


def jacfwd_jacobian(
    replica: Replica,
    residual_fn: ResidualFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    samples_per_call: int,
    param_chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J, r)`` for the ``b`` samples of ``x``: ``J`` is ``(b·m) × P``."""
    module = replica.module
    flat = replica.flat.detach()
    params = flat.numel()
    batch = x.shape[0]
    step = max(1, min(samples_per_call, batch))
    chunk = max(1, min(param_chunk, params))
    jac_parts: list[torch.Tensor] = []
    res_parts: list[torch.Tensor] = []
    for lo in range(0, batch, step):
        xs, ys = x[lo : lo + step], y[lo : lo + step]
        b = xs.shape[0]

        def residuals(theta: torch.Tensor, xs: torch.Tensor = xs, ys: torch.Tensor = ys, b: int = b) -> torch.Tensor:
            out = functional_call(module, replica.param_dict(theta), (xs,))
            return rows_of(residual_fn(out, ys), b).reshape(-1)

        with torch.no_grad():
            r = residuals(flat)
        block = torch.empty(r.numel(), params, dtype=flat.dtype, device=flat.device)
        for c0 in range(0, params, chunk):
            c1 = min(c0 + chunk, params)
            basis = torch.zeros(c1 - c0, params, dtype=flat.dtype, device=flat.device)
            basis[torch.arange(c1 - c0), torch.arange(c0, c1)] = 1

            def tangent(t: torch.Tensor, fn: Callable[..., torch.Tensor] = residuals) -> torch.Tensor:
                return jvp(fn, (flat,), (t,))[1]

            with torch.no_grad():
                block[:, c0:c1] = vmap(tangent, randomness="different")(basis).t()
        jac_parts.append(block)
        res_parts.append(r)
    if len(jac_parts) == 1:
        return jac_parts[0], res_parts[0]
    return torch.cat(jac_parts), torch.cat(res_parts)
