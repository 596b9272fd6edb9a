"""A model's trainable parameters as one flat vector θ, read and written in ``parameters()`` order.

Gradient-free optimizers (nevergrad) see the model as a function of θ ∈ ℝᴾ, P the number
of parameters with ``requires_grad``; these three helpers are perceptrain's
``perceptrain.parameters`` under the same names and meanings.
"""

from __future__ import annotations

import torch
from torch import nn


def get_parameters(model: nn.Module) -> torch.Tensor:
    """θ: the trainable parameters, flattened and concatenated.

    Arguments:
        model: the model.

    Returns:
        A tensor of P entries, in ``parameters()`` order (an empty one without trainable
        parameters).
    """
    pieces = [p.reshape(-1) for p in model.parameters() if p.requires_grad]
    if not pieces:
        return torch.zeros(0)
    return torch.cat(pieces)


def set_parameters(model: nn.Module, theta: torch.Tensor) -> None:
    """Write θ into the trainable parameters, in place (each keeps its device and dtype).

    Arguments:
        model: the model.
        theta: P values, in ``parameters()`` order (any shape; flattened).

    Raises:
        ValueError: ``theta`` does not have P values; nothing is written.
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    expected = sum(p.numel() for p in trainable)
    theta = torch.as_tensor(theta).reshape(-1)
    if theta.numel() != expected:
        raise ValueError(
            f"set_parameters: got {theta.numel()} values for a model with {expected} trainable "
            "parameters. HINT: build the vector with get_parameters(model), or the nevergrad "
            "parametrization with num_parameters(model)"
        )
    with torch.no_grad():
        start = 0
        for p in trainable:
            p.copy_(theta[start : start + p.numel()].reshape(p.shape))
            start += p.numel()


def num_parameters(model: nn.Module) -> int:
    """P: the number of trainable parameters.

    Arguments:
        model: the model.

    Returns:
        The number of entries of the parameters with ``requires_grad``.
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
