"""What the engine learns from the first samples before planning: `probe`,
`verify_layers`, `verify_broadcast`, and the default memory budget.

One forward pass on a few samples gives ``m``, the residual rows per sample (the Jacobian
has ``R = N·m`` rows), the activations per sample (which size forward-only slices), and
fails early when the residuals do not depend on the parameters or are not finite. The
layer rules (per-sample rows of ``J`` from one forward and one backward pass) are checked
once against plain per-row reverse mode on the same samples.
"""

from __future__ import annotations

import torch
from torch import nn

from . import _settings
from ._errors import ResidualNotDifferentiableError, ResidualShapeError, message
from ._modes import ResidualFn, broadcast_jacobian, layers_jacobian
from ._modes._common import require_graph, rows_of
from ._modes._points import points_jacobian
from ._modes._reference import reference_jacobian
from ._points import PointResidual, piecewise_linear_layers
from ._replicas import Replica
from ._slicing import to_device
from ._validate import check_finite_residuals

__all__ = [
    "PROBE_SAMPLES",
    "default_budget",
    "probe",
    "probe_points",
    "verify_broadcast",
    "verify_layers",
]

#: Samples the probe and the layer-rule check run on.
PROBE_SAMPLES = 4


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


def _first_samples(
    replica: Replica, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    k = min(PROBE_SAMPLES, int(inputs.shape[0]))
    return to_device(inputs[:k], replica.device), to_device(targets[:k], replica.device), k


def probe(
    replica: Replica, residual_fn: ResidualFn, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[int, int]:
    """``(m, activations per sample)`` from a forward pass on the first samples."""
    x, y, k = _first_samples(replica, inputs, targets)
    activations = 0

    def count(_m: nn.Module, _a: tuple[torch.Tensor, ...], out: object) -> None:
        nonlocal activations
        if isinstance(out, torch.Tensor):
            activations += out.numel()

    leaves = [m for m in replica.module.modules() if not list(m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.enable_grad():
            res = rows_of(residual_fn(replica.module(x), y), k)
    finally:
        for h in handles:
            h.remove()
    require_graph(res)
    check_finite_residuals(res.detach(), res.shape[1])
    _refuse_growing_rows(replica, residual_fn, x, y, int(res.shape[1]))
    return int(res.shape[1]), max(1, activations // k)


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
    residual.check_targets(targets)
    tags = targets[:, 0].detach().to("cpu", torch.int64)
    firsts = [
        (int(g), torch.nonzero(tags == g).reshape(-1)[:PROBE_SAMPLES])
        for g in torch.unique(tags).tolist()
    ]  # the first points of every group, wherever they sit in the batch
    index = torch.cat([i for _g, i in firsts])
    x = to_device(inputs[index], replica.device)
    y = to_device(targets[index], replica.device)
    activations = 0

    def count(_m: nn.Module, _a: tuple[torch.Tensor, ...], out: object) -> None:
        nonlocal activations
        if isinstance(out, torch.Tensor):
            activations += out.numel()

    leaves = [m for m in replica.module.modules() if not list(m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            replica.module(x)
    finally:
        for h in handles:
            h.remove()
    k = int(x.shape[0])
    jac, res = points_jacobian(
        replica, residual, x, y, "vmap", samples_per_call=k, param_chunk=replica.flat.numel()
    )
    m = int(res.numel()) // k
    check_finite_residuals(res.reshape(k, m), m)
    rows = jac.reshape(k, m, -1)
    start = 0
    for group, picked in firsts:
        count_here = int(picked.numel())
        if not bool(rows[start : start + count_here].any()):
            _refuse_constant_group(replica, residual, group)
        start += count_here
    return m, max(1, activations // k)


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


def verify_layers(
    replica: Replica, residual_fn: ResidualFn, inputs: torch.Tensor, targets: torch.Tensor
) -> str | None:
    """``None`` when the layer rules agree with plain per-sample reverse mode on the first
    samples, else why not.

    The rules assume each trainable parameter acts only through its own layer's forward
    (no weight used outside it, no in-place change of a layer output); where that fails
    the comparison does, and the engine uses vmap instead.
    """
    x, y, _k = _first_samples(replica, inputs, targets)
    j_rules, _ = layers_jacobian(replica, residual_fn, x, y)
    j_ref, _ = reference_jacobian(replica, residual_fn, x, y)
    scale = max(1.0, float(j_ref.abs().max()))
    tol = 1e3 * torch.finfo(j_ref.dtype).eps * scale
    diff = float((j_rules - j_ref).abs().max())
    if diff <= tol:
        return None
    return (
        f"the layer rules disagree with per-sample reverse mode by {diff:.3g} (> {tol:.3g}) on "
        "this model (a weight used outside its layer, or an in-place op on a layer output)"
    )


def verify_broadcast(
    replica: Replica, residual_fn: ResidualFn, inputs: torch.Tensor, targets: torch.Tensor
) -> str | None:
    """``None`` when per-sample parameters (``broadcast`` mode) give the Jacobian of plain
    per-sample reverse mode on the first samples, else why not.

    A model that declares ``per_sample_parameters`` but mixes the samples' parameters (a
    reduction over the sample axis, a parameter used as a shape or a Python number) fails
    here, by an error or by the comparison, and the engine uses another mode.
    """
    x, y, _k = _first_samples(replica, inputs, targets)
    try:
        j_rule, _ = broadcast_jacobian(replica, residual_fn, x, y)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        return f"the model failed with per-sample parameters ({type(err).__name__}: {err})"
    j_ref, _ = reference_jacobian(replica, residual_fn, x, y)
    if j_rule.shape != j_ref.shape:
        return (
            f"per-sample parameters gave a Jacobian of shape {tuple(j_rule.shape)}, "
            f"plain reverse mode {tuple(j_ref.shape)}"
        )
    scale = max(1.0, float(j_ref.abs().max()))
    tol = 1e3 * torch.finfo(j_ref.dtype).eps * scale
    diff = float((j_rule - j_ref).abs().max())
    if diff <= tol:
        return None
    return (
        f"per-sample parameters disagree with per-sample reverse mode by {diff:.3g} "
        f"(> {tol:.3g}) on this model (its forward mixes the samples' parameters)"
    )
