"""The model of a batch of fits: f(x, *p), written for one fit, vectorised by ``torch.func``.

For M fits with parameters θ (M × P) and inputs x (shared, or one per fit), ``values``
gives f(x_m, *θ_m) for every m (M × N) and ``values_and_jacobian`` gives those values and
the Jacobians ∂f/∂θ (M × N × P) in one forward-mode pass: ``torch.func.jacfwd`` (P tangents,
P is small) under ``torch.func.vmap`` over the fits. vmap asks of f what it asks of any
function it batches: torch operations on the parameters (no NumPy, no ``float(p)`` or
``p.item()``), no Python control flow that reads a parameter's value (``if p > 0:``; use
``torch.where``), and no in-place writes into tensors it did not create. ``check_model``
runs f once under vmap and jacfwd on two fits before any work, so that a model that
breaks one of these rules is refused with the reason and a HINT.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.func import jacfwd, vmap

from ..scipy.args import hinted

__all__ = ["BatchModel", "check_model", "torch_own_warnings_quiet"]

#: The warnings torch raises from its own modules about its own API (``torch.func.jacfwd``'s
#: first use scripts a helper with the deprecated ``torch.jit.script``): not the user's, and
#: not to fail a fit under ``-W error``. A warning raised in the user's f is located in f's
#: module and passes through.
TORCH_OWN_WARNINGS = (DeprecationWarning, FutureWarning)


@contextmanager
def torch_own_warnings_quiet() -> Iterator[None]:
    """Ignore ``TORCH_OWN_WARNINGS`` raised from torch's own modules, nothing else."""
    with warnings.catch_warnings():
        for category in TORCH_OWN_WARNINGS:
            warnings.filterwarnings("ignore", category=category, module=r"torch(\.|$)")
        yield


class BatchModel:
    """f(x, *p) over a batch of fits; ``x_per_fit`` says whether x has a leading fit axis.
    ``free`` (the indices of the parameters every fit fits; None: all) makes forward mode
    carry tangents for those only: the columns of the fixed ones are zero, and a tangent per
    fixed parameter would cost as much as one per fitted one. ``constants`` (index → value)
    names the fixed parameters whose value every fit shares: f gets them as Python numbers,
    as in a model with the values written in, instead of one value per fit."""

    def __init__(
        self,
        f: Callable[..., Any],
        points: int,
        x_per_fit: bool,
        free: tuple[int, ...] | None = None,
        constants: dict[int, float] | None = None,
    ) -> None:
        self.f, self.points, self.x_per_fit, self.free = f, points, x_per_fit, free
        self.constants = constants or {}

    def _one(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self._shaped(self.f(x, *theta.unbind()), theta)

    def _shaped(self, value: Any, theta: torch.Tensor) -> torch.Tensor:
        out = (
            value
            if isinstance(value, torch.Tensor)
            else torch.as_tensor(value, dtype=theta.dtype, device=theta.device)
        ).reshape(-1)
        return out.expand(self.points) if out.numel() == 1 else out

    def _both(self, theta: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._one(theta, x)
        return out, out

    def values(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """f for every fit: (M, N)."""
        with torch.no_grad(), torch_own_warnings_quiet():
            return vmap(self._one, in_dims=(0, 0 if self.x_per_fit else None))(theta, x)

    def _both_free(
        self, part: torch.Tensor, theta: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # The fixed values go to f as they are, without tangents: stacked with the free
        # ones they would carry zero tangents through every operation of f.
        full: list[Any] = list(theta.unbind())
        for value, k in zip(part.unbind(), self.free or (), strict=True):
            full[k] = value
        for k, number in self.constants.items():
            full[k] = number
        out = self._shaped(self.f(x, *full), theta)
        return out, out

    def values_and_jacobian(
        self, theta: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(f, ∂f/∂θ) for every fit: (M, N) and (M, N, P), one forward-mode pass."""
        x_dim = 0 if self.x_per_fit else None
        with torch.no_grad(), torch_own_warnings_quiet():
            if self.free is None:
                jac, out = vmap(jacfwd(self._both, has_aux=True), in_dims=(0, x_dim))(theta, x)
                return out, jac
            index = torch.tensor(self.free, device=theta.device)
            part, out = vmap(jacfwd(self._both_free, has_aux=True), in_dims=(0, 0, x_dim))(
                theta[:, index], theta, x
            )
        jac = part.new_zeros((*part.shape[:-1], theta.shape[1]))
        jac[..., index] = part
        return out, jac


def check_model(model: BatchModel, theta: torch.Tensor, x: torch.Tensor) -> None:
    """Run f on (up to) two fits under vmap and jacfwd; refuse it, with the reason and a
    HINT, when it cannot be batched or returns the wrong number of values."""
    take = min(2, theta.shape[0])
    xs = x[:take] if model.x_per_fit else x
    try:
        values, jac = model.values_and_jacobian(theta[:take], xs)
    except Exception as err:
        raise hinted(
            ValueError,
            f"curve_fit_batch vectorises f over the fits with torch.func.vmap and "
            f"differentiates it with torch.func.jacfwd, and f failed under them: "
            f"{type(err).__name__}: {err}.",
            "write f(x, *p) with torch operations on the parameters (no NumPy, float(p), "
            "p.item() or `if p > 0:`; use torch.where for branches); or fit one at a time "
            "with curve_fit",
        ) from err
    if values.shape != (take, model.points):
        raise hinted(
            ValueError,
            f"f returned {tuple(values.shape[1:])} values for one fit; ydata has "
            f"{model.points} points per fit.",
            "f(x, *p) must return one value per point of a fit (or one number)",
        )
    if not torch.is_floating_point(values) or jac.shape[-1] != theta.shape[1]:
        raise hinted(
            ValueError,
            f"f returned {values.dtype} values, not floating point.",
            "return a floating-point tensor from f",
        )
