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
from torch import nn
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

        def residuals(
            theta: torch.Tensor, xs: torch.Tensor = xs, ys: torch.Tensor = ys, b: int = b
        ) -> torch.Tensor:
            out = functional_call(module, replica.param_dict(theta), (xs,))
            return rows_of(residual_fn(out, ys), b).reshape(-1)

        with torch.no_grad():
            r = residuals(flat)
        block = torch.empty(r.numel(), params, dtype=flat.dtype, device=flat.device)
        for c0 in range(0, params, chunk):
            c1 = min(c0 + chunk, params)
            basis = torch.zeros(c1 - c0, params, dtype=flat.dtype, device=flat.device)
            basis[torch.arange(c1 - c0), torch.arange(c0, c1)] = 1

            def tangent(
                t: torch.Tensor, fn: Callable[..., torch.Tensor] = residuals
            ) -> torch.Tensor:
                tangent_out: torch.Tensor = jvp(fn, (flat,), (t,))[1]
                return tangent_out

            with torch.no_grad():
                block[:, c0:c1] = vmap(tangent, randomness="different")(basis).t()
        jac_parts.append(block)
        res_parts.append(r)
    jac = jac_parts[0] if len(jac_parts) == 1 else torch.cat(jac_parts)
    _zero_padding_columns(replica, jac)
    return jac, res_parts[0] if len(res_parts) == 1 else torch.cat(res_parts)


def _zero_padding_columns(replica: Replica, jac: torch.Tensor) -> None:
    """Give embedding padding rows the zero derivative reverse mode gives them.

    ``nn.Embedding(padding_idx=k)`` defines the gradient of row ``k`` as zero (the row
    is never trained); forward mode differentiates the lookup as written, so the
    columns of that row are cleared to keep every mode the same function's Jacobian.
    """
    offset = 0
    owners: dict[int, tuple[int, torch.Tensor]] = {}
    for p, size in zip(replica.params, replica.sizes, strict=True):
        owners[id(p)] = (offset, p)
        offset += size
    for module in replica.module.modules():
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            entry = owners.get(id(module.weight))
            if entry is not None:
                start, weight = entry
                dim = weight.shape[1]
                lo = start + int(module.padding_idx) * dim
                jac[:, lo : lo + dim] = 0
