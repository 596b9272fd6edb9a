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

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.func import jacrev, jvp, vmap

from .._columns import ColumnSubset
from .._points import PointResidual
from .._replicas import Replica

__all__ = ["points_jacobian", "points_residuals"]

ToParams = Callable[[Sequence[torch.Tensor]], dict[str, torch.Tensor]]


def _primals(
    replica: Replica, columns: ColumnSubset | None
) -> tuple[tuple[torch.Tensor, ...], ToParams, torch.Tensor, torch.Tensor, int]:
    """The tensors differentiated, how they make the parameter dict, and for column ``c``
    of ``J`` its tensor (``owner``) and entry (``local``); the number of columns."""
    flat = replica.flat.detach()
    if columns is None:
        params = int(flat.numel())
        return (
            (flat,),
            lambda ts: replica.param_dict(ts[0]),
            torch.zeros(params, dtype=torch.int64),
            torch.arange(params),
            params,
        )
    values = replica.param_dict(flat)
    names = [replica.names[t] for t in columns.tensors]
    primals = tuple(values.pop(n) for n in names)

    def to_params(ts: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(values)
        out.update(zip(names, ts, strict=True))
        return out

    owner = torch.empty(columns.size, dtype=torch.int64)
    local = torch.empty(columns.size, dtype=torch.int64)
    for i, part in enumerate(columns.parts):
        owner[part.positions] = i
        local[part.positions] = part.local
    return primals, to_params, owner, local, columns.size


def points_residuals(
    replica: Replica, residual: PointResidual, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The ``b × m`` residuals at the replica's parameters, without a graph through θ."""
    params = replica.param_dict(replica.flat.detach())
    return residual.rows(replica.module, params, x, y).detach()


def points_jacobian(
    replica: Replica,
    residual: PointResidual,
    x: torch.Tensor,
    y: torch.Tensor,
    mode: str,
    *,
    samples_per_call: int,
    param_chunk: int,
    columns: ColumnSubset | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(J, r)`` for the ``b`` points of ``x``: ``J`` is ``(b·m) × P`` (or ``× k``)."""
    sorting = residual.grouped(y)
    if sorting is not None:
        # Points of the groups interleaved: evaluate them sorted, hand the rows back in order.
        order, restore = (i.to(x.device) for i in sorting)
        jac, res = points_jacobian(
            replica,
            residual,
            x[order],
            y[order],
            mode,
            samples_per_call=samples_per_call,
            param_chunk=param_chunk,
            columns=columns,
        )
        b = int(x.shape[0])
        m = int(res.numel()) // b
        return (
            jac.reshape(b, m, -1)[restore].reshape(b * m, -1),
            res.reshape(b, m)[restore].reshape(-1),
        )
    primals, to_params, owner, local, width = _primals(replica, columns)
    if mode == "jacfwd":
        return _forward(replica, residual, x, y, primals, to_params, owner, local, param_chunk)
    return _reverse(
        replica, residual, x, y, primals, to_params, owner, local, width, samples_per_call
    )


def _reverse(
    replica: Replica,
    residual: PointResidual,
    x: torch.Tensor,
    y: torch.Tensor,
    primals: tuple[torch.Tensor, ...],
    to_params: ToParams,
    owner: torch.Tensor,
    local: torch.Tensor,
    width: int,
    samples_per_call: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    module = replica.module
    grads: list[tuple[torch.Tensor, ...]] = []
    blocks: list[torch.Tensor] = []
    for group, code, lo, hi in residual.runs(y):
        one = residual.point_fn(group, code)

        def with_aux(
            ps: tuple[torch.Tensor, ...], xi: torch.Tensor, yi: torch.Tensor, one: Any = one
        ) -> tuple[torch.Tensor, torch.Tensor]:
            r = one(module, to_params(ps), xi, yi)
            return r, r

        per_point = vmap(
            jacrev(with_aux, has_aux=True),
            in_dims=(None, 0, 0),
            randomness="different",
            chunk_size=max(1, min(samples_per_call, hi - lo)),
        )
        g, r = per_point(primals, x[lo:hi], y[lo:hi])
        grads.append(tuple(g))
        blocks.append(r)
    res = residual.stack(blocks)
    rows = int(res.numel())
    device = replica.flat.device
    if len(primals) == 1 and width == int(primals[0].numel()):
        parts = [g[0].reshape(-1, width) for g in grads]
        jac = parts[0] if len(parts) == 1 else torch.cat(parts)
        return jac.detach().reshape(rows, width), res.reshape(-1).detach()
    jac = torch.empty(rows, width, dtype=replica.flat.dtype, device=device)
    for i, p in enumerate(primals):
        cols = torch.nonzero(owner == i).reshape(-1)
        if not cols.numel():
            continue
        parts = [g[i].reshape(-1, p.numel()) for g in grads]
        block = parts[0] if len(parts) == 1 else torch.cat(parts)
        jac[:, cols.to(device)] = block.index_select(1, local[cols].to(device)).detach()
    return jac, res.reshape(-1).detach()


def _forward(
    replica: Replica,
    residual: PointResidual,
    x: torch.Tensor,
    y: torch.Tensor,
    primals: tuple[torch.Tensor, ...],
    to_params: ToParams,
    owner: torch.Tensor,
    local: torch.Tensor,
    param_chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    module = replica.module
    device = replica.flat.device

    def rows(*ps: torch.Tensor) -> torch.Tensor:
        return residual.rows(module, to_params(ps), x, y).reshape(-1)

    res = rows(*primals).detach()
    width = int(owner.numel())
    jac = torch.empty(res.numel(), width, dtype=replica.flat.dtype, device=device)
    chunk = max(1, min(param_chunk, width))
    for c0 in range(0, width, chunk):
        c1 = min(c0 + chunk, width)
        tangents = []
        for i, p in enumerate(primals):
            basis = torch.zeros(c1 - c0, p.numel(), dtype=p.dtype, device=device)
            hit = torch.nonzero(owner[c0:c1] == i).reshape(-1)
            if hit.numel():
                basis[hit.to(device), local[c0:c1][hit].to(device)] = 1
            tangents.append(basis.view(c1 - c0, *p.shape))

        def pushed(*ts: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = jvp(rows, primals, ts)[1]
            return out

        jac[:, c0:c1] = vmap(pushed, randomness="different")(*tangents).t().detach()
    return jac, res
