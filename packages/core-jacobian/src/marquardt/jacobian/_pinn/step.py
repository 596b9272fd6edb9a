"""The damped Gauss–Newton step of a `PointResidual` as one pure tensor function, compiled
on request: `PinnStep`.

For the rows ``r(θ)`` of a physics-informed residual at fixed points and targets, the step
at ``θ`` with damping ``λ`` solves Marquardt's system (Marquardt 1963)

    (A + λ·D) δ = g,    A = JᵀJ / N,  g = Jᵀr / N,  D = diag(A) (floored),

with ``J = ∂r/∂θ`` (``N × P``) taken per point by reverse mode over θ through the point's
input derivatives. For a network that is an ``nn.Sequential`` of ``Linear`` and layers with
a forward-Laplacian rule, ``u``, ``∂u/∂x`` and ``∂²u/∂x_j²`` at a point come from one
forward pass of the three channels (Li et al. 2023), written here as a function of θ so
that ``torch.func`` and the compiler see one graph; any other network is differentiated by
``torch.func`` (`PointModel`). ``J``, ``A``, ``g``, the Cholesky factorisation and the
solve are then one function of ``(θ, λ)`` for a given network, points and dtype, which
``torch.compile`` (``fullgraph=True``) may trace whole. The eager function is the
reference: the compiled one computes the same thing, and a network the compiler cannot
trace runs eagerly, with one `CompileFallbackWarning`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.func import jacrev, vmap

from .._errors import CompileFallbackWarning, message
from .._modes._taylor import LAYERS, taylor_layers, taylor_support
from .._points import PointModel, PointResidual

__all__ = ["PinnStep"]

#: The floor of Marquardt's scaling D, relative to its largest entry.
_SCALE_FLOOR = 1e-12

Triple = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class _TaylorPoint:
    """``u`` at one point as `PointModel` answers it, from a forward-Laplacian pass of the
    layers at the parameters ``params`` (a function of them, for ``torch.func``)."""

    def __init__(self, layers: list[tuple[nn.Module, str]], params: Mapping[str, torch.Tensor]):
        self._layers = layers
        self.params = params
        self._at: tuple[torch.Tensor, Triple] | None = None

    def _channels(self, x: torch.Tensor) -> Triple:
        # One pass per point: fn asks u, u.grad and u.hessian_diagonal of the same x.
        if self._at is not None and self._at[0] is x:
            return self._at[1]
        z = self._pass(x)
        self._at = (x, z)
        return z

    def _pass(self, x: torch.Tensor) -> Triple:
        d = int(x.shape[0])
        eye = torch.eye(d, dtype=x.dtype, device=x.device).unsqueeze(0)
        z: Triple = (x.unsqueeze(0), eye, torch.zeros_like(eye))
        for layer, name in self._layers:
            if isinstance(layer, nn.Linear):
                w = self.params[name + ".weight"].t()
                bias = self.params.get(name + ".bias")
                v = z[0] @ w if bias is None else z[0] @ w + bias
                z = (v, z[1] @ w, z[2] @ w)
            else:
                z = LAYERS[type(layer)](layer, z)
        # (k,), (k, d), (k, d): the outputs, their gradients, their second derivatives.
        return z[0][0], z[1][0].t(), z[2][0].t()

    @staticmethod
    def _one(t: torch.Tensor) -> torch.Tensor:
        return t.squeeze(0) if int(t.shape[0]) == 1 else t

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._one(self._channels(x)[0])

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        """``∂u/∂x`` at ``x``."""
        return self._one(self._channels(x)[1])

    def hessian_diagonal(self, x: torch.Tensor) -> torch.Tensor:
        """``∂²u/∂x_j²`` at ``x``."""
        return self._one(self._channels(x)[2])

    def laplacian(self, x: torch.Tensor) -> torch.Tensor:
        """``Δu`` at ``x``."""
        return self.hessian_diagonal(x).sum(-1)


def _named_layers(model: nn.Module) -> list[tuple[nn.Module, str]] | None:
    """The layers of ``model`` with their names, when the forward Laplacian serves it
    (a `HardBoundary` excepted: ``torch.func`` serves that one), else None."""
    if not isinstance(model, nn.Sequential) or not taylor_support(model)[0]:
        return None
    names = {id(m): name for name, m in model.named_modules()}
    return [(layer, names[id(layer)]) for layer in taylor_layers(model)]


class PinnStep:
    """Marquardt's damped step of a `PointResidual` at fixed points, eager or compiled.

    Arguments:
        model: the network (its trainable parameters are θ, in ``named_parameters``
            order).
        residual: the residual; its groups' ``fn`` receive ``u`` as a `PointModel`.
        inputs: the points, as built by ``residual.batch``.
        targets: their targets, as built by ``residual.batch``.
        compile: trace and compile the step with ``torch.compile(fullgraph=True)`` at its
            first call: True (inductor's kernels) or the name of a ``torch.compile``
            backend; False: the eager function.

    A call ``step(damping)`` returns ``(δ, loss)`` at the model's current parameters,
    ``δ`` flat in ``named_parameters`` order (the update is θ − δ) and ``loss = ‖r‖²/N``.
    """

    def __init__(
        self,
        model: nn.Module,
        residual: PointResidual,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        compile: bool | str = False,
    ) -> None:
        self.model = model
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._names = [n for n, _ in named]
        self._shapes = [p.shape for _, p in named]
        self._buffers = dict(model.named_buffers())
        sorting = residual.grouped(targets)
        if sorting is not None:
            inputs, targets = inputs[sorting[0]], targets[sorting[0]]
        self._parts = [
            (residual.point_rows(g, code), inputs[lo:hi], targets[lo:hi])
            for g, code, lo, hi in residual.runs(targets)
        ]
        self._layers = _named_layers(model)
        self.compiled = bool(compile)
        self._fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] = self.eager
        if compile:
            backend = "inductor" if compile is True else str(compile)
            self._fn = torch.compile(self.eager, backend=backend, fullgraph=True, dynamic=False)

    @property
    def forward_laplacian(self) -> bool:
        """Whether the network's input derivatives come from the forward Laplacian."""
        return self._layers is not None

    def theta(self) -> torch.Tensor:
        """The model's trainable parameters, flat (a copy)."""
        params = dict(self.model.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self._names])

    def _params(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        at = 0
        for name, shape in zip(self._names, self._shapes, strict=True):
            size = shape.numel()
            out[name] = theta[at : at + size].reshape(shape)
            at += size
        return out

    def _point(self, params: dict[str, torch.Tensor]) -> Any:
        if self._layers is not None:
            return _TaylorPoint(self._layers, params)
        return PointModel(self.model, {**self._buffers, **params})

    def jacobian(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``J = ∂r/∂θ`` and ``r`` at ``theta``, per point by reverse mode over θ.

        Arguments:
            theta: θ, flat.

        Returns:
            ``(J, r)``: ``(N, P)`` and ``(N,)``.
        """
        jacs, res = [], []
        for fn, x, y in self._parts:

            def one(th: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor, fn: Any = fn) -> Any:
                r = fn(self._point(self._params(th)), xi, yi).reshape(-1)
                return r, r

            jac, r = vmap(jacrev(one, has_aux=True), in_dims=(None, 0, 0))(theta, x, y)
            jacs.append(jac.reshape(-1, int(theta.numel())))
            res.append(r.reshape(-1))
        return torch.cat(jacs), torch.cat(res)

    def eager(
        self, theta: torch.Tensor, damping: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step as a pure function (the reference the compiled step is tested against).

        Arguments:
            theta: θ, flat.
            damping: λ, a 0-dim tensor.

        Returns:
            ``(δ, loss)``: the solution of ``(A + λD) δ = g`` and ``‖r‖²/N``.
        """
        jac, r = self.jacobian(theta)
        n = r.shape[0]
        a = jac.t() @ jac / n
        g = jac.t() @ r / n
        d = a.diagonal()
        d = d.clamp(min=_SCALE_FLOOR * d.max())
        factor = torch.linalg.cholesky(a + damping * torch.diag(d))
        delta = torch.cholesky_solve(g.unsqueeze(1), factor).squeeze(1)
        return delta, r @ r / n

    def step(self, damping: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(δ, loss)`` at the model's current parameters with damping ``λ = damping``.

        Arguments:
            damping: λ.

        Returns:
            ``(δ, loss)``, as `eager` returns them.
        """
        theta = self.theta()
        lam = torch.tensor(damping, dtype=theta.dtype, device=theta.device)
        if self._fn is self.eager:
            return self.eager(theta, lam)
        try:
            return self._fn(theta, lam)
        except Exception as exc:  # the compiler's refusals have no common base class
            self._fn = self.eager
            self.compiled = False
            warnings.warn(
                CompileFallbackWarning(
                    message(
                        "a compiled PINN step (PinnStep(compile=True)) was requested",
                        f"the compiler could not trace the network: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}",
                        "the step runs eagerly from now on; pass compile=False to silence this",
                    )
                ),
                stacklevel=2,
            )
            return self.eager(theta, lam)
