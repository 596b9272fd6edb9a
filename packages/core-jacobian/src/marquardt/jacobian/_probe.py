"""What the engine learns from the first samples before planning: `probe`,
`probe_points`, and the default memory budget.

One forward pass on a few samples gives ``m``, the residual rows per sample (the Jacobian
has ``R = N·m`` rows), the activations per sample (which size forward-only slices), and
fails early when the residuals do not depend on the parameters or are not finite. The
fast rules of the mode table are checked on the same samples (``_modes._verify``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from . import _settings
from ._errors import ResidualNotDifferentiableError, ResidualShapeError, message
from ._modes import ModeCall, ResidualFn
from ._modes._common import require_graph, rows_of
from ._modes._points import points_reverse
from ._modes._verify import PROBE_SAMPLES, first_points, first_samples, group_firsts
from ._points import PointResidual, piecewise_linear_layers
from ._replicas import Replica
from ._validate import check_finite_residuals

__all__ = ["PROBE_SAMPLES", "default_budget", "probe", "probe_points"]


def default_budget(device: torch.device) -> int:
    """Bytes one chunk may take on ``device`` when the engine was given no budget:
    ``MARQUARDT_JACOBIAN_MEMORY_BUDGET``, else half the GPU memory a new allocation can
    take (the driver's free memory and torch's cached, unused blocks; at least 64 MiB), else
    the CPU default."""
    forced = _settings.memory_budget()
    if forced is not None:
        return forced
    if device.type == "cuda":
        # What torch's caching allocator holds unused is handed out before new driver memory.
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return max(1 << 26, (free + max(0, cached)) // 2)
    return _settings.DEFAULT_CPU_BUDGET


@contextmanager
def _counting_activations(model: nn.Module) -> Iterator[Callable[[], int]]:
    """Count the numbers the model's leaf modules output while the block runs; yields a
    function that reads the count."""
    total = 0

    def count(_m: nn.Module, _a: tuple[torch.Tensor, ...], out: object) -> None:
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel()

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        yield lambda: total
    finally:
        for h in handles:
            h.remove()


def probe(
    replica: Replica, residual_fn: ResidualFn, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[int, int]:
    """``(m, activations per sample)`` from a forward pass on the first samples."""
    x, y, k = first_samples(replica, inputs, targets)
    with _counting_activations(replica.module) as activations, torch.enable_grad():
        res = rows_of(residual_fn(replica.module(x), y), k)
    require_graph(res)
    check_finite_residuals(res.detach(), res.shape[1])
    _refuse_growing_rows(replica, residual_fn, x, y, int(res.shape[1]))
    return int(res.shape[1]), max(1, activations() // k)


def _refuse_growing_rows(
    replica: Replica, residual_fn: ResidualFn, x: torch.Tensor, y: torch.Tensor, m: int
) -> None:
    """Refuse residuals whose count per sample grows with the batch: ``out - y`` with
    outputs (N, 1) and targets (N,) broadcasts to N × N, which the first samples alone
    cannot tell from N × m. One forward on one sample fewer tells them apart."""
    k = int(x.shape[0])
    if k < 2:
        return
    with torch.no_grad():
        out = replica.module(x)
        whole = residual_fn(out, y)
        fewer = residual_fn(replica.module(x[: k - 1]), y[: k - 1])
    if fewer.numel() == (k - 1) * m:
        return
    raise ResidualShapeError(
        message(
            "residual_fn(outputs, targets) was expected to return the same number of "
            "residuals per sample for any batch",
            f"on {k} samples, outputs of shape {tuple(out.shape)} and targets of shape "
            f"{tuple(y.shape)} gave residuals of shape {tuple(whole.shape)} ({m} per "
            f"sample), on {k - 1} samples {tuple(fewer.shape)}: their count per sample grows "
            "with the batch (the two broadcast against each other)",
            "give the targets the outputs' shape (y.reshape(outputs.shape), e.g. y[:, None] "
            "for outputs (N, 1)), or write residual_fn as lambda out, y: out.reshape(y.shape) - y",
        )
    )


def probe_points(
    replica: Replica, residual: PointResidual, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[int, int]:
    """``(m, activations per point)`` of a `PointResidual`, from its first points of
    every group; refuses a group whose residuals do not depend on θ because of ReLU-like
    layers.

    The activations are those of the plain forward (the planner multiplies them by the
    residual's ``graph_factor``, the input-derivative graph). A group whose rows of ``J``
    are all exactly zero on its first points gives the LM step nothing to fit: with
    ReLU-like layers under a second derivative (zero almost everywhere) that is the rule,
    not bad luck, and it is refused before any work. Activations called as functions
    (``F.relu`` inside a ``forward``) are not seen as layers and not refused.
    """
    x, y = first_points(replica, residual, inputs, targets)
    firsts = group_firsts(targets)
    with _counting_activations(replica.module) as activations, torch.no_grad():
        replica.module(x)
    k = int(x.shape[0])
    jac, res = points_reverse(replica, residual, ModeCall.whole(replica, x, y))
    m = int(res.numel()) // k
    check_finite_residuals(res.reshape(k, m), m)
    rows = jac.reshape(k, m, -1)
    start = 0
    for group, picked in firsts:
        count_here = int(picked.numel())
        if not bool(rows[start : start + count_here].any()):
            _refuse_constant_group(replica, residual, group)
        start += count_here
    return m, max(1, activations() // k)


def _refuse_constant_group(replica: Replica, residual: PointResidual, group: int) -> None:
    """Raise when the model's piecewise-linear layers explain a group's zero rows of J.

    Without such layers zero rows are legitimate (a group that does not involve the
    trainable parameters, such as boundary rows when only a coefficient is trained)."""
    flat = piecewise_linear_layers(replica.module)
    if not flat:
        return
    name = residual.groups[group].name
    raise ResidualNotDifferentiableError(
        message(
            f"the Jacobian of group {name!r} of {residual!r} with respect to the parameters "
            "was requested",
            "its residuals do not depend on the parameters at its first points (J rows are 0) "
            f"and the model has piecewise-linear layers ({', '.join(flat[:4])}), whose second "
            "derivative by the inputs is zero almost everywhere",
            "use a smooth activation (nn.Tanh, nn.SiLU, nn.Softplus, nn.GELU) for residuals "
            "that differentiate the model twice",
        )
    )
