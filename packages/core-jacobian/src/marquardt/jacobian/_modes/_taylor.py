"""Values, input gradients and second derivatives propagated forward together through
an MLP: the forward Laplacian (Li et al. 2023, "A computational framework for neural
network-based variational Monte Carlo with Forward Laplacian", Nat. Mach. Intell. 6).

For ``u = f_L ∘ … ∘ f_1`` at points ``x ∈ ℝᵈ`` each layer maps three channels together:
the value ``v``, the input gradients ``g_j = ∂v/∂x_j`` and the second derivatives along
each input ``h_j = ∂²v/∂x_j²`` (their sum is ``Δv``). A ``Linear`` layer maps each
channel by its weight (the bias enters ``v`` alone); an elementwise ``σ`` maps them by the
chain rule,

    v ← σ(v),    g_j ← σ'(v)·g_j,    h_j ← σ''(v)·g_j² + σ'(v)·h_j,

starting from ``v = x``, ``g_j = e_j``, ``h_j = 0``. Layers of other kinds register
their map in `LAYERS`, and a model around a network (a `Wrapper`) registers how its
channels follow from the network's in `WRAPPERS`: the physics-informed layers
(``_pinn.taylor_rules``: Fourier and periodic features, a fixed linear map followed by
``cos`` and ``sin``; a hard boundary, by the product rule) are registered so. One batched pass thus gives
``u``, ``∇u`` and the diagonal of the Hessian at a chunk of points as ``1 + 2d`` rows per
point through the same matrix products, where ``torch.func.hessian`` differentiates a
backward pass ``d`` times at every point. The pre-activations of every ``Linear`` are
kept (`Channels`): a backward pass from the residuals to them gives each point's
gradient by each weight as a sum of outer products over the channels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "LAYERS",
    "WRAPPERS",
    "ChannelMap",
    "Channels",
    "Triple",
    "Wrapper",
    "cos_sin",
    "elementwise",
    "sinusoid",
    "taylor_forward",
    "taylor_layers",
    "taylor_support",
]

#: ``σ, σ', σ''`` of an elementwise layer at its input.
Derivatives = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _tanh(_m: nn.Module, z: torch.Tensor) -> Derivatives:
    t = torch.tanh(z)
    s1 = 1 - t * t
    return t, s1, -2 * t * s1


def _sigmoid(_m: nn.Module, z: torch.Tensor) -> Derivatives:
    s = torch.sigmoid(z)
    s1 = s * (1 - s)
    return s, s1, s1 * (1 - 2 * s)


def _silu(_m: nn.Module, z: torch.Tensor) -> Derivatives:
    s = torch.sigmoid(z)
    s1 = s * (1 - s)
    return z * s, s + z * s1, s1 * (2 + z * (1 - 2 * s))


def _softplus(m: nn.Module, z: torch.Tensor) -> Derivatives:
    assert isinstance(m, nn.Softplus)
    beta = float(m.beta)
    # Above the threshold softplus is the identity, as torch computes it.
    linear = beta * z > m.threshold
    s = torch.sigmoid(beta * z)
    value = F.softplus(z, beta=m.beta, threshold=m.threshold)
    s1 = torch.where(linear, torch.ones_like(z), s)
    s2 = torch.where(linear, torch.zeros_like(z), beta * s * (1 - s))
    return value, s1, s2


def _gelu(_m: nn.Module, z: torch.Tensor) -> Derivatives:
    phi = torch.exp(-0.5 * z * z) / (2 * torch.pi) ** 0.5
    cdf = 0.5 * (1 + torch.erf(z / 2**0.5))
    return z * cdf, cdf + z * phi, phi * (2 - z * z)


def _identity(_m: nn.Module, z: torch.Tensor) -> Derivatives:
    return z, torch.ones_like(z), torch.zeros_like(z)


Rule = Callable[[nn.Module, torch.Tensor], Derivatives]
#: The three channels at a layer: ``v`` (``b × n``), ``g`` and ``h`` (``b × d × n``).
Triple = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
#: A layer's map of the channels.
ChannelMap = Callable[[nn.Module, Triple], Triple]


def elementwise(rule: Rule) -> ChannelMap:
    """The channel map of an elementwise layer.

    Arguments:
        rule: ``σ, σ', σ''`` of the layer at its input.

    Returns:
        The map of the three channels by the chain rule.
    """

    def apply(layer: nn.Module, z: Triple) -> Triple:
        v, g, h = z
        s0, s1, s2 = rule(layer, v)
        s1, s2 = s1.unsqueeze(1), s2.unsqueeze(1)
        return s0, s1 * g, s2 * g * g + s1 * h

    return apply


def sinusoid(omega: Callable[[nn.Module], float]) -> Rule:
    """The rule of ``sin(ω·z)``.

    Arguments:
        omega: ω of a layer.

    Returns:
        ``σ, σ', σ''`` of ``sin(ω·z)`` at ``z``.
    """

    def rule(m: nn.Module, z: torch.Tensor) -> Derivatives:
        w = omega(m)
        s, c = torch.sin(w * z), torch.cos(w * z)
        return s, w * c, -w * w * s

    return rule


def _cosine(_m: nn.Module, z: torch.Tensor) -> Derivatives:
    c, s = torch.cos(z), torch.sin(z)
    return c, -s, -c


_COS = elementwise(_cosine)
_SIN = elementwise(sinusoid(lambda _m: 1.0))


def cos_sin(layer: nn.Module, z: Triple) -> tuple[Triple, Triple]:
    """The channels of ``cos z`` and ``sin z``.

    Arguments:
        layer: the layer they belong to.
        z: the channels of its input.

    Returns:
        Those of ``cos z``, then those of ``sin z``.
    """
    return _COS(layer, z), _SIN(layer, z)


#: The layers the forward Laplacian maps (besides ``Linear``), by type.
LAYERS: dict[type[nn.Module], ChannelMap] = {
    nn.Tanh: elementwise(_tanh),
    nn.Sigmoid: elementwise(_sigmoid),
    nn.SiLU: elementwise(_silu),
    nn.Softplus: elementwise(_softplus),
    nn.GELU: elementwise(_gelu),
    nn.Identity: elementwise(_identity),
}


def _unsupported(module: nn.Module) -> str | None:
    """``None`` when ``module`` is a layer the forward Laplacian maps, else why not."""
    if isinstance(module, nn.Linear):
        return None
    if isinstance(module, nn.GELU) and module.approximate != "none":
        return f"GELU(approximate={module.approximate!r}) has no rule (the exact GELU has)"
    if type(module) in LAYERS:
        return None
    known = ", ".join(sorted(t.__name__ for t in LAYERS))
    return f"{type(module).__name__} has no forward-Laplacian rule (Linear and {known} have)"


def taylor_layers(model: nn.Module) -> list[nn.Module]:
    """The layers of a (nested) ``nn.Sequential``, in order; ``[model]`` for any other."""
    if not isinstance(model, nn.Sequential):
        return [model]
    return [leaf for m in model for leaf in taylor_layers(m)]


def taylor_support(model: nn.Module) -> tuple[bool, str]:
    """Whether ``model`` is an ``nn.Sequential`` of ``Linear`` and layers with a
    rule, every trainable parameter in a ``Linear`` (or a `Wrapper` around one); and
    why (or why not)."""
    wrapper = WRAPPERS.get(type(model))
    if wrapper is not None:
        ok, why = taylor_support(wrapper.inner(model))
        return ok, why if ok else f"the network inside {type(model).__name__}: {why}"
    if not isinstance(model, nn.Sequential):
        return False, (
            f"the model ({type(model).__name__}) is not an nn.Sequential, so its forward "
            "cannot be mapped layer by layer"
        )
    layers = taylor_layers(model)
    for layer in layers:
        problem = _unsupported(layer)
        if problem is not None:
            return False, problem
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    if not linears:
        return False, "the model has no Linear layer"
    if len({id(m) for m in linears}) < len(linears):
        return False, "a Linear layer is used twice (shared weights)"
    return True, (
        "a Sequential of Linear and elementwise layers: values, gradients and second "
        "derivatives propagated forward together (forward Laplacian)"
    )


@dataclass(frozen=True)
class Channels:
    """One forward-Laplacian pass over ``b`` points of ``d`` inputs.

    Arguments:
        value: ``u``, ``b × k``.
        grad: ``∂u/∂x``, ``b × k × d``.
        second: ``∂²u/∂x_j²``, ``b × k × d``.
        linears: each ``Linear`` layer with its input channels ``b × (1 + 2d) × n_in``
            (value, gradients, second derivatives) and its output channels ``(v, g, h)``
            (in the graph from the first layer's, which are leaves).
    """

    value: torch.Tensor
    grad: torch.Tensor
    second: torch.Tensor
    linears: tuple[tuple[nn.Linear, torch.Tensor, Triple], ...]


def taylor_forward(model: nn.Module, x: torch.Tensor) -> Channels:
    """The forward Laplacian of ``model`` (one that `taylor_support` accepts) at the points
    ``x`` (``b × d``), with a graph from the first ``Linear``'s output channels (leaves) to
    the outputs."""
    wrapper = WRAPPERS.get(type(model))
    if wrapper is not None:
        return wrapper.combine(model, x, taylor_forward(wrapper.inner(model), x))
    b, d = int(x.shape[0]), int(x.shape[1])
    eye = torch.eye(d, dtype=x.dtype, device=x.device).expand(b, d, d)
    z: Triple = (x, eye, torch.zeros_like(eye))
    linears: list[tuple[nn.Linear, torch.Tensor, Triple]] = []
    for layer in taylor_layers(model):
        if not isinstance(layer, nn.Linear):
            z = LAYERS[type(layer)](layer, z)
            continue
        inputs = torch.cat([z[0].unsqueeze(1), z[1], z[2]], 1).detach()
        w = layer.weight.detach().t()
        v = z[0] @ w if layer.bias is None else torch.addmm(layer.bias.detach(), z[0], w)
        z = (v, z[1] @ w, z[2] @ w)
        if not linears:
            z = (z[0].requires_grad_(True), z[1].requires_grad_(True), z[2].requires_grad_(True))
        linears.append((layer, inputs, z))
    return Channels(
        value=z[0], grad=z[1].transpose(1, 2), second=z[2].transpose(1, 2), linears=tuple(linears)
    )


@dataclass(frozen=True)
class Wrapper:
    """A model around a network whose channels follow from the network's.

    Arguments:
        inner: the network inside a model.
        combine: the channels of the model at the points ``x`` from those of its network.
    """

    inner: Callable[[nn.Module], nn.Module]
    combine: Callable[[nn.Module, torch.Tensor, Channels], Channels]


#: The models around a network that the forward Laplacian maps, by type.
WRAPPERS: dict[type[nn.Module], Wrapper] = {}
