"""Bounds l ≤ p ≤ u on curve-fit parameters by a change of variables (MINUIT's).

LM works on unconstrained internal variables q, and the model sees p = φ(q), which lies
within the bounds for every q (James & Roos 1975, MINUIT; the same transform as lmfit):

* both bounds finite:  p = l + (u − l)·(1 + sin q)/2,     q = arcsin(2(p − l)/(u − l) − 1);
* lower bound only:    p = l − 1 + √(q² + 1),             q = √((p − l + 1)² − 1);
* upper bound only:    p = u + 1 − √(q² + 1),             q = √((u − p + 1)² − 1);
* no bound:            p = q.

Every iterate is feasible by construction; the Jacobian the solver sees is J·φ'(q), by
autograd. Where the optimum lies on a bound, φ'(q) → 0 there and LM crawls (the price of
the transform), so ``_curve.large.active_set`` holds such parameters at the bound; docs/algorithm.md
explains the choice. A start
exactly on a bound (φ' = 0) is moved into the interior by ``INTERIOR`` of the range (or of
max(1, |bound|) for a one-sided bound), since no step could leave it.
"""

from __future__ import annotations

import torch

__all__ = ["INTERIOR", "Bounds"]

#: Relative distance a start on a bound is moved inwards.
INTERIOR = 1e-6


class Bounds:
    """The transform p = φ(q) for per-parameter bounds ``lower`` and ``upper`` (float64, CPU).

    Bounds are checked by the caller (``lower < upper``, no NaN).
    """

    def __init__(self, lower: torch.Tensor, upper: torch.Tensor) -> None:
        self.lower = lower
        self.upper = upper
        lo_f = torch.isfinite(lower)
        hi_f = torch.isfinite(upper)
        self.both = lo_f & hi_f
        self.lower_only = lo_f & ~hi_f
        self.upper_only = ~lo_f & hi_f
        self.active = bool((lo_f | hi_f).any())

    def interior(self, p: torch.Tensor) -> torch.Tensor:
        """``p`` with any entry on a bound moved inwards (see the module docstring)."""
        lo = torch.where(torch.isfinite(self.lower), self.lower, torch.zeros_like(self.lower))
        hi = torch.where(torch.isfinite(self.upper), self.upper, torch.zeros_like(self.upper))
        width = torch.where(
            self.both, hi - lo, torch.clamp(torch.maximum(lo.abs(), hi.abs()), min=1.0)
        )
        nudge = INTERIOR * width
        out = p.clone()
        at_lo = torch.isfinite(self.lower) & (p <= self.lower)
        at_hi = torch.isfinite(self.upper) & (p >= self.upper)
        out = torch.where(at_lo, self.lower + nudge, out)
        return torch.where(at_hi, self.upper - nudge, out)

    def to_internal(self, p: torch.Tensor) -> torch.Tensor:
        """q = φ⁻¹(p) for p within the bounds (moved off them first)."""
        p = self.interior(p)
        lo = torch.where(torch.isfinite(self.lower), self.lower, torch.zeros_like(p))
        hi = torch.where(torch.isfinite(self.upper), self.upper, torch.zeros_like(p))
        span = torch.where(self.both, hi - lo, torch.ones_like(p))
        q_both = torch.arcsin(torch.clamp(2.0 * (p - lo) / span - 1.0, -1.0, 1.0))
        q_lower = torch.sqrt(torch.clamp((p - lo + 1.0) ** 2 - 1.0, min=0.0))
        q_upper = torch.sqrt(torch.clamp((hi - p + 1.0) ** 2 - 1.0, min=0.0))
        q = torch.where(self.both, q_both, p)
        q = torch.where(self.lower_only, q_lower, q)
        return torch.where(self.upper_only, q_upper, q)

    def to_external(self, q: torch.Tensor) -> torch.Tensor:
        """p = φ(q), differentiable; works on any device and inside ``torch.func`` transforms."""
        if not self.active:
            return q
        # q may carry trailing axes (one column per sample, ``broadcast`` Jacobians).
        trail = (1,) * (q.dim() - 1)
        lower = self.lower.to(q.device, q.dtype).reshape(-1, *trail)
        upper = self.upper.to(q.device, q.dtype).reshape(-1, *trail)
        both = self.both.to(q.device).reshape(-1, *trail)
        lower_only = self.lower_only.to(q.device).reshape(-1, *trail)
        upper_only = self.upper_only.to(q.device).reshape(-1, *trail)
        lo = torch.where(torch.isfinite(lower), lower, torch.zeros_like(lower))
        hi = torch.where(torch.isfinite(upper), upper, torch.zeros_like(upper))
        root = torch.sqrt(q * q + 1.0)
        p_both = lo + (hi - lo) * (1.0 + torch.sin(q)) * 0.5
        p_lower = lo - 1.0 + root
        p_upper = hi + 1.0 - root
        p = torch.where(both, p_both, q)
        p = torch.where(lower_only, p_lower, p)
        p = torch.where(upper_only, p_upper, p)
        # Rounding can put l + (u − l)·1 a hair outside [l, u]; clamp so every iterate the
        # model sees is feasible. (The clamp is inactive, with derivative 1, inside.)
        p = torch.minimum(p, torch.where(torch.isfinite(upper), upper, p))
        return torch.maximum(p, torch.where(torch.isfinite(lower), lower, p))
