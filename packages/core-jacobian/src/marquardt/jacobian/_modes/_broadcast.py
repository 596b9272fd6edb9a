"""Per-sample parameters: all of ``J`` from one forward and one backward pass.

For a model that evaluates sample ``i`` at its own copy ``θᵢ`` of the parameters when each
parameter is given with a trailing sample axis (``θ`` of shape ``(*p.shape, b)``; curve
models written with element-wise torch operations do, e.g. ``a·exp(−b·x) + c`` with
``a``, ``b``, ``c`` vectors of length ``b``), the copies ``Θ = θ·1ᵀ`` (``P × b``) make the
Jacobian a gradient: since ``rᵢ`` depends on ``θᵢ`` alone,

    ∂(Σᵢ r_{i,k}) / ∂Θ[:, i] = ∂r_{i,k}/∂θ,

so one backward pass of ``Σᵢ r_{i,k}`` gives column block ``k`` of ``Jᵀ`` (``P × b``) at
the cost of about two forward passes, whatever ``P`` (forward mode needs ``P`` tangents;
``vmap`` over samples pays its overhead per sample). ``m`` residuals per sample take ``m``
backward passes. A model declares that it evaluates per-sample parameters this way with
the attribute ``per_sample_parameters = True``; the engine checks the rule once against
plain reverse mode on the first samples (``verify_broadcast``) before relying on it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from .._replicas import Replica
from ._common import ModeCall, ResidualFn, Rows, require_graph, rows_of

__all__ = ["BROADCAST_CHUNK", "SUPPORT_FLAG", "broadcast_jacobian", "broadcast_support"]

#: The attribute by which a model says it evaluates per-sample parameters.
SUPPORT_FLAG = "per_sample_parameters"

#: Samples per chunk at most: element-wise work on chunks of this size stays in the CPU's
#: cache (2¹⁶ float64 samples: 512 KiB per intermediate), which is what makes the pass fast.
BROADCAST_CHUNK = 1 << 16


def broadcast_support(model: nn.Module) -> tuple[bool, str]:
    """Whether ``model`` declares that it evaluates per-sample parameters, and why (not)."""
    if getattr(model, SUPPORT_FLAG, False) is True:
        return True, f"the model evaluates per-sample parameters ({SUPPORT_FLAG}=True)"
    return False, f"the model does not declare {SUPPORT_FLAG}=True"


def broadcast_jacobian(replica: Replica, residual_fn: ResidualFn, call: ModeCall) -> Rows:
    """``(J, r)`` for the ``b`` samples of ``call.x``: ``J`` is ``(b·m) × P``, a transposed
    view of the ``P × (b·m)`` gradient (no copy)."""
    x, y = call.x, call.y
    flat = replica.flat.detach()
    params = flat.numel()
    b = int(x.shape[0])
    copies = flat.unsqueeze(1).expand(params, b).clone().requires_grad_(True)
    pieces = torch.split(copies, replica.sizes)
    per_sample = {
        name: piece.reshape(*shape, b)
        for name, piece, shape in zip(replica.names, pieces, replica.shapes, strict=True)
    }
    with torch.enable_grad():
        out = functional_call(replica.module, per_sample, (x,))
        res = rows_of(residual_fn(out, y), b)
    require_graph(res)
    m = int(res.shape[1])
    if m == 1:
        (grad,) = torch.autograd.grad(res.sum(), copies, allow_unused=True, materialize_grads=True)
        return grad.t(), res.detach().reshape(-1)
    transposed = torch.empty(params, b, m, dtype=flat.dtype, device=flat.device)
    for k in range(m):
        (grad,) = torch.autograd.grad(
            res[:, k].sum(),
            copies,
            retain_graph=k < m - 1,
            allow_unused=True,
            materialize_grads=True,
        )
        transposed[:, :, k] = grad
    return transposed.reshape(params, b * m).t(), res.detach().reshape(-1)
