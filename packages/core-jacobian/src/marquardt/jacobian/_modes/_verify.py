"""The checks a fast rule passes once per engine before it is relied on: `verify_layers`,
`verify_broadcast`.

Each computes the Jacobian of the first samples by its rule and by plain per-row reverse
mode (``_reference``, the definition) and compares them, within a tolerance of a
thousand rounding errors of the largest entry.
"""

from __future__ import annotations

import torch

from .._points import PointResidual
from .._replicas import Replica
from .._slicing import to_device
from ._broadcast import broadcast_jacobian
from ._common import ModeCall, ResidualFn
from ._layers import layers_jacobian
from ._reference import reference_jacobian

__all__ = [
    "PROBE_SAMPLES",
    "disagreement",
    "first_points",
    "first_samples",
    "group_firsts",
    "verify_broadcast",
    "verify_layers",
]

#: Samples the probe and the rule checks run on.
PROBE_SAMPLES = 4


def first_samples(
    replica: Replica, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The first ``PROBE_SAMPLES`` samples on the replica's device, and their number."""
    k = min(PROBE_SAMPLES, int(inputs.shape[0]))
    return to_device(inputs[:k], replica.device), to_device(targets[:k], replica.device), k


def group_firsts(targets: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """``(group, indices)``: the first ``PROBE_SAMPLES`` points of every group of a
    `PointResidual` batch, wherever they sit in it."""
    tags = targets[:, 0].detach().to("cpu", torch.int64)
    return [
        (int(g), torch.nonzero(tags == g).reshape(-1)[:PROBE_SAMPLES])
        for g in torch.unique(tags).tolist()
    ]


def first_points(
    replica: Replica, residual: PointResidual, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first points of every group (`group_firsts`) on the replica's device."""
    residual.check_targets(targets)
    index = torch.cat([i for _g, i in group_firsts(targets)])
    return to_device(inputs[index], replica.device), to_device(targets[index], replica.device)


def disagreement(jac: torch.Tensor, reference: torch.Tensor) -> tuple[float, float] | None:
    """``None`` when ``jac`` matches ``reference``, else ``(the largest difference, the
    tolerance)``."""
    scale = max(1.0, float(reference.abs().max()))
    tol = 1e3 * torch.finfo(reference.dtype).eps * scale
    diff = float((jac - reference).abs().max())
    return None if diff <= tol else (diff, tol)


def verify_layers(
    replica: Replica, residual_fn: ResidualFn, inputs: torch.Tensor, targets: torch.Tensor
) -> str | None:
    """``None`` when the layer rules agree with plain per-sample reverse mode on the first
    samples, else why not.

    The rules assume each trainable parameter acts only through its own layer's forward
    (no weight used outside it, no in-place change of a layer output); where that fails
    the comparison does, and the engine uses vmap instead.
    """
    x, y, _k = first_samples(replica, inputs, targets)
    j_rules, _ = layers_jacobian(replica, residual_fn, ModeCall.whole(replica, x, y))
    off = disagreement(j_rules, reference_jacobian(replica, residual_fn, x, y)[0])
    if off is None:
        return None
    return (
        f"the layer rules disagree with per-sample reverse mode by {off[0]:.3g} "
        f"(> {off[1]:.3g}) on this model (a weight used outside its layer, or an in-place "
        "op on a layer output)"
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
    x, y, _k = first_samples(replica, inputs, targets)
    try:
        j_rule, _ = broadcast_jacobian(replica, residual_fn, ModeCall.whole(replica, x, y))
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        return f"the model failed with per-sample parameters ({type(err).__name__}: {err})"
    j_ref, _ = reference_jacobian(replica, residual_fn, x, y)
    if j_rule.shape != j_ref.shape:
        return (
            f"per-sample parameters gave a Jacobian of shape {tuple(j_rule.shape)}, "
            f"plain reverse mode {tuple(j_ref.shape)}"
        )
    off = disagreement(j_rule, j_ref)
    if off is None:
        return None
    return (
        f"per-sample parameters disagree with per-sample reverse mode by {off[0]:.3g} "
        f"(> {off[1]:.3g}) on this model (its forward mixes the samples' parameters)"
    )
