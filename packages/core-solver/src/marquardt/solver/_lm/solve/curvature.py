"""Curvature from a subsample: how many samples the products JᵀJv of a step use.

Martens 2010 ("Deep learning via Hessian-free optimization", §4.1) forms the gradient
Jᵀr from the whole batch and the Gauss-Newton products of CG from a subsample S of it,
drawn afresh each step: (N/|S|)·J_SᵀJ_S v is an unbiased estimate of JᵀJv, and a step's
curvature work shrinks by N/|S| while its direction still descends the full-batch loss
(the gain ratio is measured on the whole batch). The size comes from the CG budget: a
step spends ``iterations + rank`` products (CG's budget and the preconditioner's sketch),
so |S| = ⌈``CURVATURE_PASSES``·N / (iterations + rank)⌉ makes all of them cost about as
much as ``CURVATURE_PASSES`` products over the whole batch, never fewer than
``MIN_CURVATURE_SAMPLES`` samples (nor more than N: small batches use every sample, and
the products are then exact). Where the engine can form the subsample's rows of J
explicitly (``explicit``: at most that many samples, within its memory cap), the size is
capped there: each product is then two matrix products instead of a pass through the
model, and the budget buys many more of them.
"""

from __future__ import annotations

import math

import torch

__all__ = ["CURVATURE_PASSES", "MIN_CURVATURE_SAMPLES", "curvature_size", "draw_samples"]

#: A step's curvature products cost about this many products over the whole batch.
CURVATURE_PASSES = 2.0
#: The fewest samples a curvature subsample holds (where the batch has more).
MIN_CURVATURE_SAMPLES = 512


def curvature_size(
    option: int | float | None, samples: int, products: int, explicit: int = 0
) -> int:
    """|S|: how many of ``samples`` the step's curvature products use.

    Arguments:
        option: ``TruncatedCG.curvature_samples``: None (from the budget, the module
            docstring), a fraction in (0, 1] of the samples, or a count ≥ 1.
        samples: N, the batch's samples.
        products: the products a step may spend (CG's budget and the sketch's rank).
        explicit: the most samples whose rows of J the engine forms explicitly (0: none);
            caps the size chosen from the budget.

    Returns:
        |S|, in [1, N].
    """
    n = max(1, samples)
    if option is None:
        size = math.ceil(CURVATURE_PASSES * n / max(1, products))
        size = max(size, MIN_CURVATURE_SAMPLES)
        if explicit >= 1:
            size = min(size, explicit)
    elif isinstance(option, float):
        size = math.ceil(option * n)
    else:
        size = int(option)
    return max(1, min(n, size))


def draw_samples(samples: int, size: int, generator: torch.Generator) -> torch.Tensor | None:
    """``size`` distinct sample indices of ``samples``, uniformly without replacement and
    sorted (None when ``size`` covers every sample: the products are then exact)."""
    if size >= samples:
        return None
    return torch.randperm(samples, generator=generator)[:size].sort().values
