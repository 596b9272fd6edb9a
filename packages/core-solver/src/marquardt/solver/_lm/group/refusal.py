"""The ranks refuse a batch together: a rank whose data or residuals are not finite.

Such a rank still takes its part in the step's collectives up to the next one that can
carry the news: the memory plan's (`refuse`, with its flag down) when the data check or
planning found them; else the products', with NaN in place of its products or rows
(`not_finite_products`). It then raises ``BatchNotFiniteError`` or
``ResidualNotFiniteError``; every other rank learns of it through that collective and
raises ``ResidualNotFiniteError`` (`refused_elsewhere`, `summed_totals`), so no
collective is left waiting and nothing changes on any rank.
"""

from __future__ import annotations

import math

import torch

from marquardt.jacobian import JacobianEngine, NormalProducts, PreparedBatch, ResidualNotFiniteError

from ..._errors import message
from .collectives import Collectives

__all__ = ["REFUSED", "not_finite_products", "refuse", "refused_elsewhere", "summed_totals"]

#: What a rank says when another refused its share of the batch.
REFUSED = "another rank's data or residuals are NaN or infinite: it refused its part of the batch"


def refused_elsewhere(what: str) -> ResidualNotFiniteError:
    """The error of a rank whose own residuals were finite, when another rank's were not."""
    return ResidualNotFiniteError(
        message(
            "finite residuals on every rank were expected",
            what,
            "the rank whose residuals are not finite names the sample in its own error; "
            "nothing was changed on any rank",
        )
    )


def refuse(collectives: Collectives, strategy: str) -> None:
    """This rank's part in a step whose batch it refused before planning it: the
    collectives the others make until they learn of it, the row count (``strategy="auto"``)
    and the memory plan's minimum, with its flag down; ``LMA`` then raises on every other
    rank."""
    if strategy == "auto":
        collectives.summed(torch.zeros(1, dtype=torch.float64), "sum of the row counts")
    collectives.least((1, 0, 0))


def not_finite_products(
    engine: JacobianEngine, batch: PreparedBatch, dtype: torch.dtype | None
) -> NormalProducts:
    """NaN products of this batch's shape: a rank's part when its residuals are not finite."""
    home = engine.replicas.devices[0]
    acc = dtype or engine.replicas.dtype
    k = batch.params
    return NormalProducts(
        jtj=torch.full((k, k), float("nan"), dtype=acc, device=home),
        jtr=torch.full((k,), float("nan"), dtype=acc, device=home),
        rss=float("nan"),
        rows=batch.rows,
    )


def summed_totals(packed: torch.Tensor, failure: ResidualNotFiniteError | None) -> list[float]:
    """``[‖r‖², N]`` summed over the ranks, the last two entries of an all-reduced vector.

    Raises:
        ResidualNotFiniteError: ``failure``, this rank's own, first; else the refusal of
            a rank whose residuals were finite when the sum is not (another rank's were
            NaN or infinite, or their squares overflowed).
    """
    totals: list[float] = packed[-2:].tolist()
    if failure is not None:
        raise failure
    if not math.isfinite(totals[0]):
        raise refused_elsewhere(
            "‖r‖² summed over the ranks is not finite: another rank's residuals are NaN "
            "or infinite (or their squares overflowed)"
        )
    return totals
