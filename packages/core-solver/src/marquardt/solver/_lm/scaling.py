"""The damping matrix D of (A + λD)δ = g: identity or Marquardt's diagonal scaling.

* ``identity``: D = I (Levenberg 1944). The damped step tends to the gradient direction
  scaled by 1/λ as λ grows.
* ``marquardt``: D = diag(JᵀJ)/N (Marquardt 1963), which makes the step invariant to a
  rescaling of the parameters. A parameter whose Jacobian column is (nearly) zero — a dead
  tanh unit, a parameter the batch does not see — would get no damping at all and leave
  A + λD singular, so D is clamped from below (the clamp, in every backend's arrays:
  ``_backends/scaling.py``). Moré 1978
  (§6) discusses the choice of D; his running maximum over iterations is not the default
  because the batches change from step to step, and a column norm seen on an old batch
  says little about the current one.
* ``scaling_memory`` γ ∈ [0, 1] (``LMA(scaling_memory=...)``) remembers it, decaying:
  D_k = max(diag_k, γ·D_{k−1}) (`remembered`). γ = 1 is MINPACK's running maximum
  (lmder, Moré 1978): a parameter whose column was once large stays damped after its
  column shrinks, which keeps it from running off where the model stops depending on it
  (MGH17 from NIST's start 1), but a D grown early stays too large for the rest of the
  run (NIST's Hahn1 from its second start takes many times the steps:
  ``benchmarks/bench_nist.py``); γ = 0.5 forgets it within a few steps.

The under-determined form (JJᵀ/N + λI)u = r/N is always damped with I.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["remembered"]


def remembered(diag: Any, previous: Any | None, memory: float) -> Any:
    """max(diag, memory·previous) elementwise, in ``diag``'s array kind (torch, NumPy or
    cuPyNumeric); ``diag`` itself when there is no ``previous`` of the same shape."""
    if previous is None or tuple(previous.shape) != tuple(diag.shape):
        return diag
    if isinstance(diag, torch.Tensor):
        return torch.maximum(diag, memory * previous.to(diag))
    older = memory * previous
    # max(a, b) = (a + b + |a − b|)/2 without naming the array library.
    return (diag + older + abs(diag - older)) / 2
