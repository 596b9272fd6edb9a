"""Jacobian modes: ways of computing ``J = ∂r/∂θ`` for a chunk of samples.

Each mode maps ``(replica, residual_fn, x, y, chunking)`` to ``(J, r)`` with ``J`` of
shape ``(b·m) × P`` and ``r`` of shape ``(b·m,)``, rows ordered sample-major (sample
``i``'s ``m`` residuals are rows ``i·m … i·m+m−1``). The modes, what they serve and
what they cost, are the entries of one table, `MODE_TABLE` (``_table``).
"""

from __future__ import annotations

from ._common import ResidualFn
from ._table import MODE_TABLE, JacobianMode, ModeCall, check_mode, form_of, mode_names

__all__ = [
    "MODE_TABLE",
    "JacobianMode",
    "ModeCall",
    "ResidualFn",
    "check_mode",
    "form_of",
    "mode_names",
]
