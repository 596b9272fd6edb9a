"""``J = ∂r/∂θ`` of residuals that differentiate the model by its inputs (``PointResidual``).

Each point's residual ``r_i(θ) = w·fn(u_θ, x_i, y_i)`` contains derivatives of ``u_θ`` by
``x`` (a Laplacian: ``torch.func.hessian`` inside ``fn``). Its row of ``J`` is taken by
``torch.func`` through that input-derivative graph, in one of two orders:

* ``vmap`` (reverse over θ): per point, ``jacrev`` with respect to θ of the residual —
  ``m`` vector-Jacobian products through the graph of ``Δu`` — vmapped over the points of
  a group. The cost per point is a small multiple of one residual, whatever ``P``.
* ``jacfwd`` (forward over θ): ``jvp`` of the chunk's residuals along ``c`` unit tangents
  of θ at once (vmapped), so ``P`` tangents per point in all; it wins only when ``P < m``.

Layer rules and per-sample parameters need residuals of the outputs alone and are never
used for this form. Rows come out sample-major, as for every mode; with a ``ColumnSubset``
only the tensors it touches are differentiated and its columns kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch.func import jacrev, vmap

from .._points import PointResidual
from .._replicas import Replica
from ._common import ModeCall, Primals, Rows, forward_columns

__all__ = [
    "in_point_order",
    "points_forward",
    "points_residuals",
    "points_reverse",
    "reverse_rows",
]


def points_residuals(
    replica: Replica, residual: PointResidual, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The ``b × m`` residuals at the replica's parameters, without a graph through θ."""
    params = replica.param_dict(replica.flat.detach())
    return residual.rows(replica.module, params, x, y).detach()


def points_reverse(replica: Replica, residual: PointResidual, call: ModeCall) -> Rows:
    """``(J, r)`` for the ``b`` points of ``call.x`` by per-point reverse mode over θ:
    ``J`` is ``(b·m) × P`` (or ``× k``)."""
    return in_point_order(reverse_rows, replica, residual, call)


def points_forward(replica: Replica, residual: PointResidual, call: ModeCall) -> Rows:
    """``(J, r)`` for the ``b`` points of ``call.x`` by forward mode over θ, ``c`` unit
    tangents at once: ``J`` is ``(b·m) × P`` (or ``× k``)."""
    return in_point_order(_forward, replica, residual, call)


Rule = Callable[[Replica, PointResidual, ModeCall, Primals], Rows]


def in_point_order(rule: Rule, replica: Replica, residual: PointResidual, call: ModeCall) -> Rows:
    """``rule`` on the points sorted by group where the groups are interleaved, the rows
    handed back in the points' order (into ``call.out`` where the call gives one)."""
    sorting = residual.grouped(call.y)
    if sorting is None:
        return rule(replica, residual, call, Primals.of(replica, call.columns))
    order, restore = (i.to(call.x.device) for i in sorting)
    sorted_call = replace(call, x=call.x[order], y=call.y[order], out=None)
    jac, res = in_point_order(rule, replica, residual, sorted_call)
    b = call.batch
    m = int(res.numel()) // b
    jac = jac.reshape(b, m, -1)[restore].reshape(b * m, -1)
    if call.out is not None and call.out.shape == jac.shape:
        jac = call.out.copy_(jac)
    return jac, res.reshape(b, m)[restore].reshape(-1)


def reverse_rows(
    replica: Replica, residual: PointResidual, call: ModeCall, primals: Primals
) -> Rows:
    """``(J, r)`` of the points of ``call`` (in runs by group) by per-point reverse mode
    over the tensors of ``primals``."""
    module = replica.module
    x, y = call.x, call.y
    grads: list[tuple[torch.Tensor, ...]] = []
    blocks: list[torch.Tensor] = []
    for group, code, lo, hi in residual.runs(y):
        one = residual.point_fn(group, code)

        def with_aux(
            ps: tuple[torch.Tensor, ...], xi: torch.Tensor, yi: torch.Tensor, one: Any = one
        ) -> tuple[torch.Tensor, torch.Tensor]:
            r = one(module, primals.params(ps), xi, yi)
            return r, r

        per_point = vmap(
            jacrev(with_aux, has_aux=True),
            in_dims=(None, 0, 0),
            randomness="different",
            chunk_size=max(1, min(call.samples_per_call, hi - lo)),
        )
        g, r = per_point(primals.tensors, x[lo:hi], y[lo:hi])
        grads.append(tuple(g))
        blocks.append(r)
    res = residual.stack(blocks)
    rows = int(res.numel())
    width = primals.width
    device = replica.flat.device
    if len(primals.tensors) == 1 and width == int(primals.tensors[0].numel()):
        parts = [g[0].reshape(-1, width) for g in grads]
        jac = parts[0] if len(parts) == 1 else torch.cat(parts)
        return jac.detach().reshape(rows, width), res.reshape(-1).detach()
    jac = torch.empty(rows, width, dtype=replica.flat.dtype, device=device)
    for i, p in enumerate(primals.tensors):
        cols = torch.nonzero(primals.owner == i).reshape(-1)
        if not cols.numel():
            continue
        parts = [g[i].reshape(-1, p.numel()) for g in grads]
        block = parts[0] if len(parts) == 1 else torch.cat(parts)
        jac[:, cols.to(device)] = block.index_select(1, primals.local[cols].to(device)).detach()
    return jac, res.reshape(-1).detach()


def _forward(replica: Replica, residual: PointResidual, call: ModeCall, primals: Primals) -> Rows:
    module = replica.module

    def rows(*ps: torch.Tensor) -> torch.Tensor:
        return residual.rows(module, primals.params(ps), call.x, call.y).reshape(-1)

    res = rows(*primals.tensors).detach()
    jac = torch.empty(
        res.numel(), primals.width, dtype=replica.flat.dtype, device=replica.flat.device
    )
    forward_columns(rows, primals, jac, call.param_chunk)
    return jac, res
