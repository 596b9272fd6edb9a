"""Shared pieces of the Jacobian modes: residual rows, the recorded forward, per-sample
``jacrev``, the tensors a mode differentiates (`Primals`) and forward mode over unit
tangents (`forward_columns`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import jacrev, jvp, vmap

from .._columns import ColumnSubset
from .._errors import ResidualDetachedError, ResidualShapeError, message
from .._points import ResidualFn
from .._replicas import Replica

__all__ = [
    "ModeCall",
    "Primals",
    "ResidualFn",
    "Rows",
    "forward_columns",
    "per_sample_jacrev",
    "recorded_forward",
    "require_graph",
    "rows_of",
    "zero_padding_columns",
]

Record = tuple[nn.Module, torch.Tensor, torch.Tensor]
#: What a mode returns: ``(J, r)``, ``J`` of shape ``(b·m) × P`` (or ``× k``), ``r`` of ``b·m``.
Rows = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class ModeCall:
    """The samples one call of a mode differentiates, how they are chunked, and where
    ``J`` goes: every mode takes ``(replica, residual, call)``.

    Arguments:
        x: the inputs of the ``b`` samples, on the replica's device.
        y: their targets.
        samples_per_call: samples differentiated at once.
        param_chunk: columns per forward-mode call.
        out: a contiguous ``(b·m) × P`` buffer for ``J`` (modes that write into one).
        columns: the parameter subset whose columns alone are formed, or None.
    """

    x: torch.Tensor
    y: torch.Tensor
    samples_per_call: int
    param_chunk: int
    out: torch.Tensor | None = None
    columns: ColumnSubset | None = None

    @classmethod
    def whole(cls, replica: Replica, x: torch.Tensor, y: torch.Tensor) -> ModeCall:
        """Every sample and every column at once, into a fresh ``J``."""
        return cls(x, y, int(x.shape[0]), int(replica.flat.numel()))

    @property
    def batch(self) -> int:
        """``b``, the samples of the call."""
        return int(self.x.shape[0])


def rows_of(residuals: torch.Tensor, batch: int) -> torch.Tensor:
    """The residuals of ``batch`` samples as a ``batch × m`` matrix (sample-major rows)."""
    if residuals.dim() == 0 or residuals.shape[0] != batch or residuals.numel() % batch != 0:
        raise ResidualShapeError(
            message(
                f"residual_fn was expected to return one or more residuals per sample for "
                f"a batch of {batch} (a tensor of shape ({batch}, ...))",
                f"it returned a tensor of shape {tuple(residuals.shape)}",
                "return per-sample residuals without reducing over the batch, e.g. "
                "lambda a, b: a - b or cross_entropy(..., reduction='none')",
            )
        )
    return residuals.reshape(batch, -1)


def require_graph(residuals: torch.Tensor) -> None:
    """Refuse residuals with no autograd graph: they have no Jacobian to compute."""
    if not residuals.requires_grad:
        raise ResidualDetachedError(
            message(
                "the Jacobian of residual_fn(model(x), y) with respect to the parameters was "
                "requested",
                "the residuals do not depend on any trainable parameter (no autograd graph)",
                "do not detach the model output or call .item()/.numpy() in residual_fn",
            )
        )


def recorded_forward(
    model: nn.Module,
    owners: Sequence[nn.Module],
    residual_fn: ResidualFn,
    x: torch.Tensor,
    y: torch.Tensor,
) -> tuple[list[Record], torch.Tensor]:
    """One forward pass with a graph, recording (module, its input, its output) of every
    module in ``owners``; returns the records and the ``b × m`` residuals (graph checked)."""
    records: list[Record] = []

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        records.append((module, args[0].detach(), output))

    handles = [m.register_forward_hook(hook) for m in owners]
    try:
        with torch.enable_grad():
            prediction = model(x)
            res = rows_of(residual_fn(prediction, y), x.shape[0])
    finally:
        for h in handles:
            h.remove()
    require_graph(res)
    return records, res


def per_sample_jacrev(
    residual_of: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor],
    samples_per_call: int,
    batch: int,
) -> Callable[..., tuple[Any, torch.Tensor]]:
    """``f(primals, x, y) -> (∂r/∂primals, r)`` per sample, vmapped over the batch in chunks
    of ``samples_per_call``; ``residual_of(primals, xi, yi)`` is one sample's residuals."""

    def one_sample(primals: Any, xi: torch.Tensor, yi: torch.Tensor) -> tuple[torch.Tensor, ...]:
        r = residual_of(primals, xi, yi)
        return r, r

    return vmap(
        jacrev(one_sample, has_aux=True),
        in_dims=(None, 0, 0),
        randomness="different",
        chunk_size=max(1, min(samples_per_call, batch)),
    )


@dataclass(frozen=True)
class Primals:
    """The parameter tensors a mode differentiates, and where each column of ``J`` sits.

    Arguments:
        tensors: the tensors differentiated (the flat ``θ``, or the tensors a
            ``ColumnSubset`` touches).
        constants: the other parameters by name (constants of the forward pass).
        names: the names of ``tensors`` in the parameter dict (empty for the flat ``θ``).
        owner: for column ``c`` of ``J``, the index of its tensor in ``tensors``.
        local: for column ``c`` of ``J``, its entry in that tensor (flattened).
        replica: the replica whose parameters these are.
    """

    tensors: tuple[torch.Tensor, ...]
    constants: dict[str, torch.Tensor]
    names: tuple[str, ...]
    owner: torch.Tensor
    local: torch.Tensor
    replica: Replica

    @classmethod
    def of(cls, replica: Replica, columns: ColumnSubset | None) -> Primals:
        """Every parameter as one flat tensor (``columns`` None), else the tensors the
        subset touches, the others kept constant."""
        flat = replica.flat.detach()
        if columns is None:
            params = int(flat.numel())
            zeros = torch.zeros(params, dtype=torch.int64)
            return cls((flat,), {}, (), zeros, torch.arange(params), replica)
        values = replica.param_dict(flat)
        names = tuple(replica.names[t] for t in columns.tensors)
        tensors = tuple(values.pop(n) for n in names)
        owner = torch.empty(columns.size, dtype=torch.int64)
        local = torch.empty(columns.size, dtype=torch.int64)
        for i, part in enumerate(columns.parts):
            owner[part.positions] = i
            local[part.positions] = part.local
        return cls(tensors, values, names, owner, local, replica)

    @property
    def width(self) -> int:
        """The columns of ``J``."""
        return int(self.owner.numel())

    @property
    def whole(self) -> bool:
        """Whether the tensors are the flat ``θ`` itself (every column, in order)."""
        return not self.names

    def params(self, tensors: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The parameter dict of ``functional_call`` with ``tensors`` in place of the
        differentiated ones."""
        if self.whole:
            return self.replica.param_dict(tensors[0])
        out = dict(self.constants)
        out.update(zip(self.names, tensors, strict=True))
        return out


def forward_columns(
    rows: Callable[..., torch.Tensor],
    primals: Primals,
    jac: torch.Tensor,
    param_chunk: int,
) -> None:
    """Write ``J = ∂rows/∂primals`` into ``jac`` by forward mode, ``param_chunk`` columns
    per call: column ``c``'s tangent is the unit vector of its entry in its tensor, and
    ``vmap`` over ``jvp`` pushes a chunk of them through ``rows`` at once."""
    device = jac.device
    width = primals.width
    chunk = max(1, min(param_chunk, width))
    for c0 in range(0, width, chunk):
        c1 = min(c0 + chunk, width)
        owner, local = primals.owner[c0:c1], primals.local[c0:c1]
        tangents = []
        for i, p in enumerate(primals.tensors):
            basis = torch.zeros(c1 - c0, p.numel(), dtype=p.dtype, device=device)
            hit = torch.nonzero(owner == i).reshape(-1)
            if hit.numel():
                basis[hit.to(device), local[hit].to(device)] = 1
            tangents.append(basis.view(c1 - c0, *p.shape))

        def pushed(*ts: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = jvp(rows, primals.tensors, ts)[1]
            return out

        jac[:, c0:c1] = vmap(pushed, randomness="different")(*tangents).t().detach()


def zero_padding_columns(replica: Replica, columns: ColumnSubset | None, jac: torch.Tensor) -> None:
    """Give embedding padding rows the zero derivative reverse mode gives them.

    ``nn.Embedding(padding_idx=k)`` defines the gradient of row ``k`` as zero (the row
    is never trained); forward mode differentiates the lookup as written, so the
    columns of that row (those of ``columns`` among them, or all) are cleared to keep
    every mode the same function's Jacobian.
    """
    padded = [
        m
        for m in replica.module.modules()
        if isinstance(m, nn.Embedding) and m.padding_idx is not None
    ]
    if not padded:
        return
    if columns is None:
        columns = ColumnSubset.of(torch.arange(replica.flat.numel()), replica.sizes)
    parts = {id(replica.params[p.tensor]): p for p in columns.parts}
    for module in padded:
        part = parts.get(id(module.weight))
        if part is not None and module.padding_idx is not None:
            dim = int(module.weight.shape[1])
            row = int(module.padding_idx) % int(module.weight.shape[0])
            hit = (part.local // dim) == row
            jac[:, part.positions[hit].to(jac.device)] = 0
