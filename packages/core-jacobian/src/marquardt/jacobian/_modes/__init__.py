"""Jacobian modes: ways of computing ``J = ∂r/∂θ`` for a chunk of samples.

Each mode maps ``(replica, residual_fn, x, y, chunking)`` to ``(J, r)`` with ``J`` of
shape ``(b·m) × P`` and ``r`` of shape ``(b·m,)``, rows ordered sample-major (sample
``i``'s ``m`` residuals are rows ``i·m … i·m+m−1``).
"""

from __future__ import annotations

from ._broadcast import broadcast_jacobian, broadcast_support
from ._common import ResidualFn
from ._jacfwd import jacfwd_jacobian
from ._layers import layers_jacobian, layers_support
from ._subset import subset_jacobian
from ._vmap import vmap_jacobian

__all__ = [
    "ResidualFn",
    "broadcast_jacobian",
    "broadcast_support",
    "jacfwd_jacobian",
    "layers_jacobian",
    "layers_support",
    "subset_jacobian",
    "vmap_jacobian",
]
