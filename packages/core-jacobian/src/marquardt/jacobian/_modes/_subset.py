"""The columns ``J_S`` of a parameter subset ``S``, without forming the other columns.

Every mode differentiates with respect to the parameter tensors ``S`` touches only; the
other tensors are constants of the forward pass.

* ``layers``: the per-sample rules of ``_layers``, evaluated at the selected entries only.
  For ``z = W a + b`` the column of ``W_{oj}`` is ``g_o·a_j`` per sample (summed over
  positions for sequences), so ``k`` columns cost ``b·k`` products and the outer product
  ``g aᵀ`` is never formed. Convolutions and embeddings form their own tensor's block and
  keep the selected columns (their tensors are small next to ``P``).
* ``vmap``: per-sample ``jacrev`` with respect to the touched tensors (``b·m·Σ|touched|``
  numbers, ``|touched|`` the sizes of the tensors ``S`` touches), then the selected entries.
* ``jacfwd``: one forward-mode pass per selected column, whose tangent is non-zero in one
  entry of one touched tensor.

Columns come out in the order of ``S.index`` (sorted flat indices). The mode table
(``_table``) says which of these serves which mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call

from .._columns import ColumnSubset
from .._replicas import Replica
from ._common import (
    ModeCall,
    Primals,
    ResidualFn,
    Rows,
    forward_columns,
    per_sample_jacrev,
    recorded_forward,
    rows_of,
    zero_padding_columns,
)
from ._layers import _apply_rule

__all__ = ["subset_jacfwd", "subset_layers", "subset_vmap"]


def _linear_columns(
    module: nn.Linear, param: torch.Tensor, a: torch.Tensor, g: torch.Tensor, local: torch.Tensor
) -> torch.Tensor:
    """``b × len(local)``: the selected entries of the per-sample ``g aᵀ`` (weight) or
    ``g`` (bias), summed over positions for inputs with more than two dimensions."""
    b = a.shape[0]
    a3 = a.reshape(b, -1, a.shape[-1])
    g3 = g.reshape(b, -1, g.shape[-1])
    if param is module.bias:
        picked = g3.index_select(2, local)
    else:
        width = int(module.weight.shape[1])
        picked = g3.index_select(2, local // width) * a3.index_select(2, local % width)
    return picked.sum(1) if picked.shape[1] > 1 else picked[:, 0]


def _columns_of(call: ModeCall) -> ColumnSubset:
    if call.columns is None:  # pragma: no cover - the mode table calls these with columns
        raise ValueError("a parameter subset's Jacobian was asked for without its columns")
    return call.columns


def subset_layers(replica: Replica, residual_fn: ResidualFn, call: ModeCall) -> Rows:
    """``(J_S, r)`` by the layer rules: ``J_S`` is ``(b·m) × k``, written into
    ``call.out`` (a contiguous ``(b·m) × k`` tensor) when given."""
    columns, out = _columns_of(call), call.out
    model = replica.module
    device = replica.flat.device
    wanted = {
        id(replica.params[part.tensor]): (part.local.to(device), part.positions.to(device))
        for part in columns.parts
    }
    owners = [
        m for m in model.modules() if any(id(p) in wanted for p in m.parameters(recurse=False))
    ]
    records, res = recorded_forward(model, owners, residual_fn, call.x, call.y)
    batch, m = res.shape
    k = columns.size
    jac = (
        torch.empty(batch, m, k, dtype=replica.flat.dtype, device=device)
        if out is None
        else out.view(batch, m, k)
    )
    jac.zero_()
    outputs = [rec[2] for rec in records]
    for row in range(m):
        target = jac[:, row, :]

        def put(
            param: torch.Tensor,
            compute: Callable[[torch.Tensor | None], torch.Tensor],
            target: torch.Tensor = target,
        ) -> None:
            entry = wanted.get(id(param))
            if entry is not None:
                local, positions = entry
                block = compute(None).reshape(batch, -1)
                target.index_add_(1, positions, block.index_select(1, local))

        if not outputs:
            continue
        grads = torch.autograd.grad(
            res[:, row].sum(), outputs, retain_graph=row < m - 1, allow_unused=True
        )
        for (module, a, _), g in zip(records, grads, strict=True):
            if g is None:
                continue
            g = g.detach()
            if isinstance(module, nn.Linear):
                for param in module.parameters(recurse=False):
                    entry = wanted.get(id(param))
                    if entry is not None:
                        local, positions = entry
                        target.index_add_(1, positions, _linear_columns(module, param, a, g, local))
            else:
                _apply_rule(module, a, g, put)
    return jac.reshape(batch * m, k), res.detach().reshape(-1)


def subset_vmap(replica: Replica, residual_fn: ResidualFn, call: ModeCall) -> Rows:
    """``(J_S, r)`` by per-sample ``jacrev`` with respect to the touched tensors."""
    module = replica.module
    columns = _columns_of(call)
    primals = Primals.of(replica, columns)
    batch = call.batch

    def residual_of(
        tensors: tuple[torch.Tensor, ...], xi: torch.Tensor, yi: torch.Tensor
    ) -> torch.Tensor:
        out = functional_call(module, primals.params(tensors), (xi.unsqueeze(0),))
        return rows_of(residual_fn(out, yi.unsqueeze(0)), 1).reshape(-1)

    per_sample = per_sample_jacrev(residual_of, call.samples_per_call, batch)
    with torch.enable_grad():
        grads, res = per_sample(primals.tensors, call.x, call.y)
    m = res.shape[1] if res.dim() > 1 else 1
    device = replica.flat.device
    jac = torch.zeros(batch * m, columns.size, dtype=replica.flat.dtype, device=device)
    for part, grad in zip(columns.parts, grads, strict=True):
        block = grad.reshape(batch * m, -1)
        jac.index_copy_(1, part.positions.to(device), block.index_select(1, part.local.to(device)))
    return jac, res.reshape(-1).detach()


def subset_jacfwd(replica: Replica, residual_fn: ResidualFn, call: ModeCall) -> Rows:
    """``(J_S, r)`` by forward mode, ``call.param_chunk`` selected columns per call."""
    module = replica.module
    columns = _columns_of(call)
    primals = Primals.of(replica, columns)

    def residuals(*tensors: torch.Tensor) -> torch.Tensor:
        out = functional_call(module, primals.params(tensors), (call.x,))
        return rows_of(residual_fn(out, call.y), call.batch).reshape(-1)

    with torch.no_grad():
        res = residuals(*primals.tensors)
        jac = torch.empty(
            res.numel(), columns.size, dtype=replica.flat.dtype, device=replica.flat.device
        )
        forward_columns(residuals, primals, jac, call.param_chunk)
    zero_padding_columns(replica, columns, jac)
    return jac, res
