"""Per-sample gradients from one forward and one backward pass, by layer rules.

For a layer ``z = W a + b`` applied to sample ``i`` and a scalar ``ρ = Σ_i r_{i,k}``
(one residual index ``k`` summed over the batch), backpropagation gives the output
gradients ``g_i = ∂ρ/∂z_i``. Because samples do not interact (no train-mode batch
norm), ``g_i = ∂r_{i,k}/∂z_i`` and the row of ``J`` for residual ``(i, k)`` restricted
to ``W`` is the outer product ``g_i a_iᵀ`` (summed over positions for sequences and
convolutions, through ``unfold`` for the latter), and ``g_i`` for ``b``. This is how
Opacus' GradSampleModule and BackPACK's BatchGrad form per-sample gradients
(Goodfellow 2015, "Efficient per-example gradient computations"). ``m`` residuals per
sample take ``m`` backward passes through the retained graph.

Layers with a rule: ``Linear``, ``Conv1d``/``Conv2d`` (``groups=1``, zero padding),
``Embedding`` (without ``max_norm`` or ``scale_grad_by_freq``). A model with a trainable
parameter anywhere else is not handled here: ``layers_support`` says why and the engine
uses per-sample ``vmap`` for the whole model instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .._replicas import Replica
from ._common import ModeCall, ResidualFn, Rows, recorded_forward

__all__ = ["layers_jacobian", "layers_support"]

Put = Callable[[torch.Tensor, Callable[[torch.Tensor | None], torch.Tensor]], None]


def _rule_problem(module: nn.Module) -> str | None:
    """``None`` when ``module`` has a per-sample rule, else why it has none."""
    if isinstance(module, nn.Linear):
        return None
    if isinstance(module, nn.Conv1d | nn.Conv2d):
        if module.groups != 1:
            return f"has groups={module.groups} (the rule covers groups=1)"
        if module.padding_mode != "zeros":
            return f"has padding_mode={module.padding_mode!r} (the rule covers zeros)"
        if isinstance(module.padding, str) and module.padding != "valid":
            return f"has padding={module.padding!r} (the rule covers numeric padding)"
        return None
    if isinstance(module, nn.Embedding):
        if module.max_norm is not None:
            return "renormalises rows (max_norm) during the forward pass"
        if module.scale_grad_by_freq:
            return "scales gradients by frequency in the batch"
        return None
    return "is not a Linear, Conv1d, Conv2d or Embedding layer"


def layers_support(model: nn.Module) -> tuple[bool, str]:
    """Whether every trainable parameter of ``model`` sits directly in a layer with a rule."""
    for name, sub in model.named_modules():
        if not any(p.requires_grad for p in sub.parameters(recurse=False)):
            continue
        problem = _rule_problem(sub)
        if problem is not None:
            return False, f"layer {name!r} ({type(sub).__name__}) {problem}"
    return True, "every trainable parameter sits in a Linear, Conv or Embedding layer"


def _linear(module: nn.Linear, a: torch.Tensor, g: torch.Tensor, put: Put) -> None:
    b = a.shape[0]
    if a.dim() == 2:
        put(
            module.weight,
            lambda out: (
                torch.mul(g.unsqueeze(2), a.unsqueeze(1), out=out)
                if out is not None
                else g.unsqueeze(2) * a.unsqueeze(1)
            ),
        )
        if module.bias is not None:
            put(module.bias, lambda out: out.copy_(g) if out is not None else g)
        return
    a3 = a.reshape(b, -1, a.shape[-1])
    g3 = g.reshape(b, -1, g.shape[-1])
    put(
        module.weight,
        lambda out: (
            torch.bmm(g3.transpose(1, 2), a3, out=out)
            if out is not None
            else torch.bmm(g3.transpose(1, 2), a3)
        ),
    )
    if module.bias is not None:
        put(
            module.bias, lambda out: torch.sum(g3, dim=1, out=out) if out is not None else g3.sum(1)
        )


def _into(out: torch.Tensor, written: torch.Tensor) -> torch.Tensor:
    """``out`` after a kernel wrote ``written``, a reshaped view of it, in place."""
    if written.data_ptr() != out.data_ptr():  # pragma: no cover - a view always aliases
        raise RuntimeError("a per-sample rule wrote outside the Jacobian")
    return out


def _conv(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor, g: torch.Tensor, put: Put) -> None:
    b = a.shape[0]
    if isinstance(module, nn.Conv1d):
        a4 = a.unsqueeze(2)
        kernel = (1, module.kernel_size[0])
        dilation = (1, module.dilation[0])
        stride = (1, module.stride[0])
        pad = module.padding if not isinstance(module.padding, str) else (0,)
        padding = (0, int(pad[0]))
    else:
        a4 = a
        kernel = (module.kernel_size[0], module.kernel_size[1])
        dilation = (module.dilation[0], module.dilation[1])
        stride = (module.stride[0], module.stride[1])
        pad2 = module.padding if not isinstance(module.padding, str) else (0, 0)
        padding = (int(pad2[0]), int(pad2[1]))
    cols = F.unfold(a4, kernel, dilation=dilation, padding=padding, stride=stride)
    g3 = g.reshape(b, g.shape[1], -1)
    put(
        module.weight,
        lambda out: (
            _into(out, torch.bmm(g3, cols.transpose(1, 2), out=out.view(b, g3.shape[1], -1)))
            if out is not None
            else torch.bmm(g3, cols.transpose(1, 2))
        ),
    )
    if module.bias is not None:
        put(
            module.bias, lambda out: torch.sum(g3, dim=2, out=out) if out is not None else g3.sum(2)
        )


def _embedding(module: nn.Embedding, ids: torch.Tensor, g: torch.Tensor, put: Put) -> None:
    b = ids.shape[0]
    vocab, dim = module.weight.shape
    flat_ids = ids.reshape(b, -1)
    g2 = g.reshape(b, -1, dim)
    if module.padding_idx is not None:
        g2 = g2 * (flat_ids != module.padding_idx).unsqueeze(-1).to(g2.dtype)
    rows = (torch.arange(b, device=ids.device).unsqueeze(1) * vocab + flat_ids).reshape(-1)

    def compute(out: torch.Tensor | None) -> torch.Tensor:
        dense = torch.zeros(b * vocab, dim, dtype=g.dtype, device=g.device)
        dense.index_add_(0, rows, g2.reshape(-1, dim))
        dense = dense.view(b, vocab, dim)
        return out.copy_(dense) if out is not None else dense

    put(module.weight, compute)


def _apply_rule(module: nn.Module, a: torch.Tensor, g: torch.Tensor, put: Put) -> None:
    if isinstance(module, nn.Linear):
        _linear(module, a, g, put)
    elif isinstance(module, nn.Conv1d | nn.Conv2d):
        _conv(module, a, g, put)
    elif isinstance(module, nn.Embedding):
        _embedding(module, a, g, put)
    else:  # pragma: no cover - layers_support keeps such models out
        raise TypeError(f"no per-sample rule for {type(module).__name__}")


def layers_jacobian(replica: Replica, residual_fn: ResidualFn, call: ModeCall) -> Rows:
    """``(J, r)`` for the ``b`` samples of ``call.x``: ``J`` is ``(b·m) × P``, written into
    ``call.out`` (a contiguous ``(b·m) × P`` tensor) when given."""
    out = call.out
    model = replica.module
    flat = replica.flat
    params = flat.numel()
    columns: dict[int, tuple[int, int]] = {}
    offset = 0
    for p, size in zip(replica.params, replica.sizes, strict=True):
        columns[id(p)] = (offset, size)
        offset += size

    owners = [
        m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))
    ]
    records, res = recorded_forward(model, owners, residual_fn, call.x, call.y)
    batch, m = res.shape
    if out is None:
        jac = torch.empty(batch, m, params, dtype=flat.dtype, device=flat.device)
    else:
        jac = out.view(batch, m, params)
    outputs = [rec[2] for rec in records]
    for k in range(m):
        target = jac[:, k, :]
        written: set[int] = set()

        def put(
            param: torch.Tensor,
            compute: Callable[[torch.Tensor | None], torch.Tensor],
            target: torch.Tensor = target,
            written: set[int] = written,
        ) -> None:
            if not param.requires_grad or id(param) not in columns:
                return
            start, size = columns[id(param)]
            view = target[:, start : start + size].view(batch, *param.shape)
            if id(param) in written:
                view.add_(compute(None).reshape(view.shape))
            else:
                compute(view)
                written.add(id(param))

        grads = torch.autograd.grad(
            res[:, k].sum(), outputs, retain_graph=k < m - 1, allow_unused=True
        )
        for (module, a, _), g in zip(records, grads, strict=True):
            if g is not None:
                _apply_rule(module, a, g.detach(), put)
        for p in replica.params:
            if id(p) not in written:
                start, size = columns[id(p)]
                target[:, start : start + size].zero_()
    return jac.reshape(batch * m, params), res.detach().reshape(-1)
