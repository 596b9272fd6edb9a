"""``J = ∂r/∂θ`` of a `PointResidual` from one forward-Laplacian pass and one backward
pass per chunk of points: `points_taylor`, the ``taylor`` mode.

The chunk's values, input gradients and second derivatives come from one batched pass
(``_taylor``); each group's ``fn(u, x, y)`` is mapped over the points with ``u`` answering
``u(x)``, ``u.grad(x)``, ``u.hessian_diagonal(x)`` and ``u.laplacian(x)`` from that pass
(`PointChannels`). Points do not interact, so one backward pass from the summed residual
``k`` of the chunk to every ``Linear``'s output channels ``z_c`` gives each point's
``δ_c = ∂r_{i,k}/∂z_c``, and its row of ``J`` is ``Σ_c δ_c a_cᵀ`` for the weight (over the
``1 + 2d`` channels ``c``, ``a_c`` the layer's input channels) and ``δ_value`` for the bias:
the per-sample rule of the ``layers`` mode, carried over the channels.

A group whose ``fn`` asks ``u`` for something else (``u`` at another point, a
``torch.func`` transform of ``u``, ``u.params``) is served by per-point reverse mode
instead, and the reason kept (`fallbacks`); the other groups keep the fast path.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch.func import vmap

from .._points import PointResidual
from .._replicas import Replica
from ._common import ModeCall, Primals, Rows
from ._points import in_point_order, points_residuals, points_reverse, reverse_rows
from ._taylor import Channels, taylor_forward, taylor_support
from ._verify import disagreement, first_points

__all__ = [
    "PointChannels",
    "fallbacks",
    "points_taylor",
    "taylor_residuals",
    "verify_taylor",
]


class Unserved(Exception):
    """``fn`` asked ``u`` for something a forward-Laplacian pass does not hold."""


class PointChannels:
    """``u`` at one point ``x``, answered from a forward-Laplacian pass.

    Arguments:
        x: the point the values belong to (``fn``'s own ``x``).
        value: ``u(x)``, ``(k,)``.
        grad: ``∂u/∂x``, ``(k, d)``.
        second: ``∂²u/∂x_j²``, ``(k, d)``.
    """

    def __init__(
        self, x: torch.Tensor, value: torch.Tensor, grad: torch.Tensor, second: torch.Tensor
    ) -> None:
        self._x = x
        single = int(value.shape[0]) == 1  # one output: a 0-dim u, a (d,) gradient
        self._value = value.squeeze(0) if single else value
        self._grad = grad.squeeze(0) if single else grad
        self._second = second.squeeze(0) if single else second

    def _at(self, x: torch.Tensor, what: str) -> None:
        if x is not self._x:
            raise Unserved(
                f"fn calls {what} at another tensor than its point x (u at a shifted "
                "point, or u under a torch.func transform)"
            )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self._at(x, "u")
        return self._value

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        """``∂u/∂x`` at the point."""
        self._at(x, "u.grad")
        return self._grad

    def hessian_diagonal(self, x: torch.Tensor) -> torch.Tensor:
        """``∂²u/∂x_j²`` at the point."""
        self._at(x, "u.hessian_diagonal")
        return self._second

    def laplacian(self, x: torch.Tensor) -> torch.Tensor:
        """``Δu`` at the point."""
        self._at(x, "u.laplacian")
        return self._second.sum(-1)

    @property
    def params(self) -> Any:
        """Not held: a residual that reads the parameters is served by reverse mode."""
        raise Unserved("fn reads u.params, which a forward-Laplacian pass does not hold")

    @property
    def module(self) -> Any:
        """Not held: a residual that calls the module is served by reverse mode."""
        raise Unserved("fn reads u.module, which a forward-Laplacian pass does not hold")


#: By residual, the groups served by per-point reverse mode, and why.
_FALLBACKS: weakref.WeakKeyDictionary[PointResidual, dict[str, str]] = weakref.WeakKeyDictionary()


def fallbacks(residual: PointResidual) -> dict[str, str]:
    """The groups of ``residual`` that the ``taylor`` mode serves by per-point reverse mode,
    by name, with the reason (empty until the mode has met them)."""
    return dict(_FALLBACKS.get(residual, {}))


def points_taylor(replica: Replica, residual: PointResidual, call: ModeCall) -> Rows:
    """``(J, r)`` for the ``b`` points of ``call.x`` by forward Laplacian and one backward
    pass per chunk: ``J`` is ``(b·m) × P`` (or ``× k``)."""
    return in_point_order(_taylor, replica, residual, call)


def _taylor(replica: Replica, residual: PointResidual, call: ModeCall, primals: Primals) -> Rows:
    known = _FALLBACKS.setdefault(residual, {})
    sink = _Sink(call, primals.width)
    blocks: list[torch.Tensor] = []
    for group, code, lo, hi in residual.runs(call.y):
        sub = replace(call, x=call.x[lo:hi], y=call.y[lo:hi], out=None)
        name = residual.groups[group].name
        if name not in known:
            try:
                blocks.append(_served(replica, residual.point_rows(group, code), sub, sink, lo))
                continue
            except Unserved as why:
                known[name] = str(why)
        jac, res = reverse_rows(replica, residual, sub, primals)
        blocks.append(res.reshape(hi - lo, -1))
        sink.rows(lo, hi, int(blocks[-1].shape[1])).copy_(jac)
    res = residual.stack(blocks)  # checks that every group gives the same m
    assert sink.jac is not None
    return sink.jac, res.reshape(-1)


class _Sink:
    """``J`` of a call, allocated (or taken from ``call.out``) at its first block, when
    the rows per point ``m`` are known; each block of points writes its rows in place."""

    def __init__(self, call: ModeCall, width: int) -> None:
        self.call = call
        self.width = width
        self.jac: torch.Tensor | None = None

    def rows(self, lo: int, hi: int, m: int) -> torch.Tensor:
        """The rows of ``J`` of the points ``[lo, hi)`` of the call."""
        if self.jac is None:
            shape = (self.call.batch * m, self.width)
            out = self.call.out
            self.jac = out if out is not None and tuple(out.shape) == shape else None
            if self.jac is None:
                x = self.call.x
                self.jac = torch.empty(shape, dtype=x.dtype, device=x.device)
        per_point = int(self.jac.shape[0]) // self.call.batch
        if per_point != m:  # groups of different m: refused by PointResidual.stack
            return torch.empty(((hi - lo) * m, self.width), dtype=self.jac.dtype)
        return self.jac[lo * m : hi * m]


def _served(
    replica: Replica,
    rows: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor],
    call: ModeCall,
    sink: _Sink,
    first: int,
) -> torch.Tensor:
    """The ``b × m`` residuals of one group's points (the points of ``call``, from point
    ``first`` of the sink's call on), chunk by chunk, their rows of ``J`` written to ``sink``."""
    step = max(1, call.samples_per_call)
    blocks = []
    for lo in range(0, call.batch, step):
        x, y = call.x[lo : lo + step], call.y[lo : lo + step]
        with torch.enable_grad():
            channels = taylor_forward(replica.module, x)
            res = _residuals(channels, rows, x, y)
            n, m = int(res.shape[0]), int(res.shape[1])
            dest = sink.rows(first + lo, first + lo + n, m)
            columns = call.columns
            if columns is None:
                _rows_of_j(replica, channels, res, dest)
            else:
                whole = torch.empty(n * m, int(replica.flat.numel()), dtype=dest.dtype)
                _rows_of_j(replica, channels, res, whole)
                dest.copy_(whole[:, columns.index.to(whole.device)])
        blocks.append(res.detach())
    return torch.cat(blocks)


def _residuals(
    channels: Channels,
    rows: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """The ``b × m`` residuals of a group's points from their forward-Laplacian pass."""

    def one(v: Any, g: Any, h: Any, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return rows(PointChannels(xi, v, g, h), xi, yi)

    out: torch.Tensor = vmap(one, randomness="different")(
        channels.value, channels.grad, channels.second, x, y
    )
    return out


def taylor_residuals(
    replica: Replica, residual: PointResidual, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The ``b × m`` residuals at the replica's parameters, without a graph: each group's
    from one forward-Laplacian pass where the model and its ``fn`` allow, else per point
    (the loss and the trial forward of a step)."""
    if not taylor_support(replica.module)[0]:
        return points_residuals(replica, residual, x, y)
    sorting = residual.grouped(y)
    if sorting is not None:
        order, restore = (i.to(x.device) for i in sorting)
        return taylor_residuals(replica, residual, x[order], y[order])[restore]
    known = _FALLBACKS.setdefault(residual, {})
    blocks = []
    for group, code, lo, hi in residual.runs(y):
        name = residual.groups[group].name
        if name not in known:
            try:
                with torch.no_grad():
                    channels = taylor_forward(replica.module, x[lo:hi])
                    rows = residual.point_rows(group, code)
                    blocks.append(_residuals(channels, rows, x[lo:hi], y[lo:hi]))
                continue
            except Unserved as why:
                known[name] = str(why)
        blocks.append(points_residuals(replica, residual, x[lo:hi], y[lo:hi]))
    return residual.stack(blocks)


def _rows_of_j(replica: Replica, channels: Channels, res: torch.Tensor, jac: torch.Tensor) -> None:
    """Write ``J`` (``(n·m) × P``) of the residuals ``res`` (``n × m``) into ``jac``, from
    their backward pass to every ``Linear``'s output channels (every column is written:
    each trainable parameter is a ``Linear``'s, as ``taylor_support`` requires)."""
    n, m = int(res.shape[0]), int(res.shape[1])
    if not res.requires_grad:
        jac.zero_()  # the rows do not depend on θ
        return
    outs = [t for _layer, _a, z in channels.linears for t in z]
    # One backward pass per residual of a point: ∂r/∂(v, g, h) of every layer.
    if m == 1:
        grads = [
            d.unsqueeze(0)
            for d in torch.autograd.grad(
                res, outs, torch.ones_like(res), allow_unused=True, materialize_grads=True
            )
        ]
    else:
        seed = torch.eye(m, dtype=res.dtype, device=res.device).unsqueeze(1).expand(m, n, m)
        grads = list(
            torch.autograd.grad(
                res, outs, seed, is_grads_batched=True, allow_unused=True, materialize_grads=True
            )
        )
    offsets = _offsets(replica)
    for i, (layer, inputs, _z) in enumerate(channels.linears):
        dv, dg, dh = grads[3 * i : 3 * i + 3]  # m × n × out, m × n × d × out (twice)
        where = offsets.get(id(layer.weight))
        if where is not None:
            delta = torch.cat([dv.unsqueeze(2), dg, dh], 2)  # m × n × channels × out
            block = jac[:, where[0] : where[1]].view(n, m, *layer.weight.shape)
            block.copy_(torch.einsum("mnco,nci->nmoi", delta, inputs))
        where = offsets.get(id(layer.bias)) if layer.bias is not None else None
        if where is not None:
            jac[:, where[0] : where[1]] = dv.transpose(0, 1).reshape(n * m, -1)


def _offsets(replica: Replica) -> dict[int, tuple[int, int]]:
    """The columns of each trainable parameter (by ``id``) in the flat ``θ``."""
    out, start = {}, 0
    for p, size in zip(replica.params, replica.sizes, strict=True):
        out[id(p)] = (start, start + size)
        start += size
    return out


def verify_taylor(
    replica: Replica, residual: PointResidual, inputs: torch.Tensor, targets: torch.Tensor
) -> str | None:
    """``None`` when the forward Laplacian serves at least one group and agrees with
    per-point reverse mode on the first points of every group, else why not."""
    x, y = first_points(replica, residual, inputs, targets)
    call = ModeCall.whole(replica, x, y)
    try:
        fast, _ = points_taylor(replica, residual, call)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        return f"the forward Laplacian failed on this residual ({type(err).__name__}: {err})"
    skipped = fallbacks(residual)
    served = [g.name for g in residual.groups if g.name not in skipped]
    if not served:
        why = "; ".join(f"group {k!r}: {v}" for k, v in skipped.items())
        return (
            f"no group's fn can take its derivatives from a forward pass ({why}); ask u "
            "itself: u.grad(x), u.laplacian(x), u.hessian_diagonal(x)"
        )
    off = disagreement(fast, points_reverse(replica, residual, call)[0])
    if off is None:
        return None
    return (
        f"the forward Laplacian disagrees with per-point reverse mode by {off[0]:.3g} "
        f"(> {off[1]:.3g}) on this model"
    )
