"""Robust losses for least squares, and the residuals that make LM minimise them.

For residuals rᵢ (already divided by σᵢ) and a scale c = ``f_scale``, the cost is

    C(θ) = ½ Σᵢ c²·ρ(zᵢ),   zᵢ = (rᵢ/c)²,

with ρ one of (the definitions of SciPy's ``least_squares``, Branch, Coleman & Li 1999;
Triggs et al. 2000, "Bundle adjustment — a modern synthesis", §4.3):

* ``linear``:  ρ(z) = z (ordinary least squares);
* ``soft_l1``: ρ(z) = 2(√(1+z) − 1);
* ``huber``:   ρ(z) = z for z ≤ 1, 2√z − 1 beyond;
* ``cauchy``:  ρ(z) = ln(1 + z);
* ``arctan``:  ρ(z) = arctan(z).

Each is concave with ρ(0) = 0 and ρ'(0) = 1, so ρ(z) ≥ ρ'(z)·z.

How LM minimises C (iteratively reweighted least squares, Holland & Welsch 1977): each
sample gives two residual rows, evaluated from the detached rᵢ,

    r̃ᵢ₁ = wᵢ·rᵢ  with wᵢ = √ρ'(zᵢ) held constant in the derivative,
    r̃ᵢ₂ = √(c²ρ(zᵢ) − ρ'(zᵢ)rᵢ²)   (a constant: zero Jacobian; real since ρ ≥ ρ'z),

so that Σ r̃² = Σ c²ρ(z) = 2C at *every* point (the loss LM accepts or rejects on is the
robust cost itself), J̃ᵀr̃ = Σ ρ'ᵢ rᵢ ∇rᵢ = ∇C exactly (the stationary points are SciPy's),
and J̃ᵀJ̃ = Σ ρ'ᵢ ∇rᵢ∇rᵢᵀ. SciPy and Ceres use ρ' + 2ρ''z instead of ρ' in that curvature
(a second-order correction, clamped at machine epsilon where it turns negative); the
weights here are the IRLS ones, constant within a step, which only changes the path, not
the optimum. ``scipy_row_scale`` gives SciPy's factor √max(ρ' + 2ρ''z, ε) for the
covariance of a robust fit, so that it agrees with ``scipy.optimize.curve_fit``.

``LMA(robust_loss=..., f_scale=...)`` uses the same rows for any model
(``robust_residual_fn``), scaled by √2 so that the mean of the squared rows over the 2R
rows is the mean of c²ρ(z) over the R residuals: the mean squared residual for the linear
loss, with the same damped system (2J̃ᵀJ̃/2R = JᵀJ/R).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .._errors import SolverConfigError, message
from .._rules import robust_scaling

__all__ = [
    "ROBUST_LOSSES",
    "check_robust_loss",
    "loss_refusal",
    "rho",
    "robust_residual_fn",
    "robust_rows",
    "scipy_row_scale",
]

#: Names accepted by ``curve_fit(loss=...)``.
ROBUST_LOSSES: tuple[str, ...] = ("linear", "soft_l1", "huber", "cauchy", "arctan")

_Rho = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _linear(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return z, torch.ones_like(z), torch.zeros_like(z)


def _soft_l1(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = torch.sqrt(1.0 + z)
    return 2.0 * (s - 1.0), 1.0 / s, -0.5 / (s * s * s)


def _huber(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    inner = z <= 1.0
    # z is clamped to ≥ 1 before the square root of the outer branch, so that the branch
    # torch.where discards never produces inf for it.
    root = torch.sqrt(torch.clamp(z, min=1.0))
    value = torch.where(inner, z, 2.0 * root - 1.0)
    first = torch.where(inner, torch.ones_like(z), 1.0 / root)
    second = torch.where(inner, torch.zeros_like(z), -0.5 / (root * root * root))
    return value, first, second


def _cauchy(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = 1.0 + z
    return torch.log1p(z), 1.0 / t, -1.0 / (t * t)


def _arctan(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = 1.0 + z * z
    return torch.arctan(z), 1.0 / t, -2.0 * z / (t * t)


_RHO: dict[str, _Rho] = {
    "linear": _linear,
    "soft_l1": _soft_l1,
    "huber": _huber,
    "cauchy": _cauchy,
    "arctan": _arctan,
}


def rho(loss: str, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ρ(z), ρ'(z), ρ''(z)) of the named loss, elementwise."""
    return _RHO[loss](z)


def robust_rows(r: torch.Tensor, loss: str, f_scale: float) -> torch.Tensor:
    """The two IRLS rows per residual (module docstring): shape ``r.shape + (2,)``.

    Row 0 is √ρ'(z)·r with the weight detached; row 1 is the detached constant
    √(c²ρ(z) − ρ'(z)r²), so the squares of both rows sum to c²ρ(z).
    """
    fixed = r.detach()
    z = (fixed / f_scale) ** 2
    value, first, _ = rho(loss, z)
    weighted = torch.sqrt(first) * r
    rest = torch.sqrt(torch.clamp(f_scale * f_scale * value - first * fixed * fixed, min=0.0))
    return torch.stack([weighted, rest], dim=-1)


def scipy_row_scale(r: torch.Tensor, loss: str, f_scale: float) -> torch.Tensor:
    """SciPy's per-row Jacobian factor √max(ρ'(z) + 2ρ''(z)·z, ε) at residuals ``r``."""
    z = (r / f_scale) ** 2
    _, first, second = rho(loss, z)
    scale: torch.Tensor = robust_scaling(r, z, first, second)[0]
    return scale


def loss_refusal(loss: object, f_scale: object) -> str | None:
    """Which of a robust loss and its scale cannot be used: ``"loss"`` (not one of
    ``ROBUST_LOSSES``), ``"f_scale"`` (not a finite number > 0; every entry of an array), or
    ``None``. The one rule every entry point words in its own terms."""
    if not isinstance(loss, str) or loss not in ROBUST_LOSSES:
        return "loss"
    if isinstance(f_scale, bool):
        return "f_scale"
    try:
        scale = np.asarray(f_scale, dtype=np.float64)
    except (TypeError, ValueError):
        return "f_scale"
    if scale.size == 0 or not bool(np.all(np.isfinite(scale)) and np.all(scale > 0.0)):
        return "f_scale"
    return None


def check_robust_loss(
    robust_loss: object, f_scale: object, loss_fn: object
) -> tuple[str, float] | None:
    """``LMA``'s (robust_loss, f_scale), checked; None for plain least squares."""
    if robust_loss is None:
        return None
    refused = loss_refusal(robust_loss, f_scale)
    if refused == "loss":
        raise SolverConfigError(
            message(
                f"LMA(robust_loss={robust_loss!r}) names a robust loss",
                f"the known ones are {ROBUST_LOSSES}",
                "use e.g. robust_loss='huber', or None for least squares",
            )
        )
    if refused == "f_scale" or not isinstance(f_scale, (int, float)):
        raise SolverConfigError(
            message(
                "LMA(f_scale=...) expects a finite number > 0",
                f"got {f_scale!r}",
                "pass the residual size beyond which a residual counts as an outlier",
            )
        )
    assert isinstance(robust_loss, str)
    if loss_fn is not None:
        raise SolverConfigError(
            message(
                "LMA was given both robust_loss and loss_fn",
                "with robust_loss the loss is the robust cost itself",
                "drop loss_fn, or drop robust_loss and write the loss yourself",
            )
        )
    return robust_loss, float(f_scale)


def robust_residual_fn(
    residual_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], loss: str, f_scale: float
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """√2 × the IRLS rows of ``residual_fn``'s residuals (see the module docstring)."""
    root2 = math.sqrt(2.0)

    def robust(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return root2 * robust_rows(residual_fn(outputs, targets), loss, f_scale)

    return robust
