"""The module ``curve_fit`` hands to `LMA`, and its residuals.

The parameters p ∈ ℝᴾ of f(x, p) are split into free ones, p_F = φ(q) with the internal
variables q of ``_curve.large.bounds`` (MINUIT's transform; q = p_F when unbounded), and parameters held
at a bound by the active set (``_curve.large.active_set``), p_H. The module's only trainable parameter
is q; its forward is f(x, *p) with p = E_F φ(q) + p_H, E_F the 0/1 matrix placing the free
entries (exact: the sum only adds zeros). The residuals are rᵢ = (f(xᵢ, p) − yᵢ)/σᵢ, with
(yᵢ, 1/σᵢ) (or yᵢ alone, without σ) carried in the targets so that slices of the data keep their weights; robust
losses replace each rᵢ by the two rows of ``_lm.robust.robust_rows``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..._lm.robust import robust_rows
from .bounds import Bounds

__all__ = ["CurveModel", "curve_residual_fn", "weighted_residuals"]


class CurveModel(nn.Module):
    """f(x, *p) with p = E_F φ(q) + p_H (module docstring); x has samples first. q may
    have a trailing sample axis (F × b: one parameter vector per sample).

    ``held`` (P,) holds the values of the held parameters (zeros where free); ``free`` (P,
    bool) marks the free ones, whose starting internal values are ``start`` (F,); ``bounds``
    are the free parameters' bounds (None: unbounded).
    """

    #: f treats each data point on its own, so p may be given per sample (a trailing
    #: sample axis on q): the Jacobian engine then forms J in one backward pass.
    per_sample_parameters = True

    def __init__(
        self,
        f: Callable[..., torch.Tensor],
        start: torch.Tensor,
        *,
        bounds: Bounds | None,
        held: torch.Tensor,
        free: torch.Tensor,
        samples_last: bool,
    ) -> None:
        super().__init__()
        self.f = f
        self.bounds = bounds
        self.samples_last = samples_last
        self.theta = nn.Parameter(start.clone())
        self.all_free = bool(free.all())
        placing = torch.eye(int(free.numel()), dtype=start.dtype, device=start.device)[:, free]
        self.register_buffer("placing", placing, persistent=False)
        self.register_buffer("held", torch.where(free, 0.0, held).to(start), persistent=False)

    def free_values(self) -> torch.Tensor:
        """φ(q): the free parameters."""
        return self.theta if self.bounds is None else self.bounds.to_external(self.theta)

    def external(self) -> torch.Tensor:
        """p, every parameter (free and held), in f's order."""
        values = self.free_values()
        if self.all_free:
            return values
        placing, held = self.placing, self.held
        assert isinstance(placing, torch.Tensor) and isinstance(held, torch.Tensor)
        return placing @ values + held.reshape(-1, *(1,) * (values.dim() - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.movedim(0, -1) if self.samples_last else x
        return self.f(xs, *self.external().unbind())


def weighted_residuals(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """r = (f − y)/σ, with targets holding (y, 1/σ) per point (or y alone: σ = 1)."""
    r = out.reshape(-1) - targets[:, 0]
    return r if targets.shape[1] == 1 else r * targets[:, 1]


def curve_residual_fn(
    loss: str, f_scale: float
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The residual function LM minimises ‖·‖² of: r itself, or the robust rows."""
    if loss == "linear":
        return weighted_residuals

    def robust(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return robust_rows(weighted_residuals(out, targets), loss, f_scale)

    return robust
