"""Causal weights for residuals in time: `CausalWeights`.

A physics-informed network of an equation in time fitted on the whole span at once may
fit the equation's residual at late times before the solution there is determined by the
early times, and settle on a wrong solution (Allen–Cahn, Kuramoto–Sivashinsky). Wang,
Sankaran & Perdikaris 2022 ("Respecting causality is all you need for training
physics-informed neural networks", arXiv:2203.07404) cut the span into ``M`` bins and
weigh bin ``i``'s squared residuals by

    w_i = exp(−ε · Σ_{k<i} L_k),        L_k = mean of r² over the points of bin k,

held fixed while a step is taken: a bin counts only once the bins before it are fitted.
Here the residual rows of a group are multiplied by ``√w_i``, so the Levenberg-Marquardt
objective is ``Σ_i w_i L_i``; `CausalWeights.update` recomputes the ``w_i`` from the model
between steps. The paper raises ``ε`` over training, to the next value of a schedule once
every weight exceeds a tolerance ``δ`` (all bins fitted at this ``ε``): `CausalWeights.anneal`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from .._errors import message
from .._points import PointFn, PointModel, PointResidual

__all__ = ["CausalWeights"]


class CausalWeights:
    """The causal weights of one group of a `PointResidual`, by time bin.

    Use: ``causal = CausalWeights((0.0, 1.0))``, the group
    ``ResidualGroup("pde", causal.weigh(pde))``, and before each step (or every few)
    ``causal.update(residual, model, x, y)`` with that step's batch.

    Arguments:
        span: ``(t0, t1)``, the time span of the points.
        bins: ``M``, the number of time bins.
        epsilon: ``ε``, how strongly unfitted early bins hold back later ones (the paper
            raises it over training, from 1e-2 to 1e2 on its problems).
        time: the input coordinate that is time (default: the last).
        group: the name of the weighted group.

    Raises:
        ValueError: an empty span, ``bins`` below 1 or a negative ``epsilon``.
    """

    def __init__(
        self,
        span: tuple[float, float],
        bins: int = 32,
        epsilon: float = 1.0,
        time: int = -1,
        group: str = "pde",
    ) -> None:
        t0, t1 = float(span[0]), float(span[1])
        if not t1 > t0 or bins < 1 or epsilon < 0:
            raise ValueError(
                message(
                    "CausalWeights(span=(t0, t1), bins, epsilon) with t1 > t0, bins ≥ 1 and "
                    "epsilon ≥ 0 was requested",
                    f"got span={span}, bins={bins}, epsilon={epsilon}",
                    "pass the time span of the points, e.g. CausalWeights((0.0, 1.0))",
                )
            )
        self.span = (t0, t1)
        self.bins = int(bins)
        self.epsilon = float(epsilon)
        self.time = int(time)
        self.group = group
        #: ``w_i`` by bin; ones until the first `update`.
        self.weights = torch.ones(self.bins, dtype=torch.float64)

    def bin_of(self, t: torch.Tensor) -> torch.Tensor:
        """The bin of each time ``t`` (a float tensor of bin indices, clamped to the span).

        Arguments:
            t: times, any shape.

        Returns:
            ``floor(M·(t − t0)/(t1 − t0))`` clamped to ``[0, M − 1]``, of the shape of ``t``.
        """
        t0, t1 = self.span
        return torch.clamp(torch.floor(self.bins * (t - t0) / (t1 - t0)), 0, self.bins - 1)

    def weigh(self, fn: PointFn) -> PointFn:
        """``fn`` with its residuals multiplied by ``√w`` of the bin of the point's time.

        Arguments:
            fn: the group's ``fn(u, x, y)``.

        Returns:
            The weighted ``fn``; it reads the current `weights` at every call.
        """

        def weighted(u: PointModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            ks = torch.arange(self.bins, dtype=x.dtype, device=x.device)
            here = (self.bin_of(x[self.time]) == ks).to(x.dtype)  # one-hot, vmap-safe
            w = (here * self.weights.to(x.device, x.dtype)).sum()
            return torch.sqrt(w) * fn(u, x, y)

        return weighted

    def update(
        self,
        residual: PointResidual,
        model: nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
    ) -> torch.Tensor:
        """Recompute the weights from the model's residuals of the group at the points of
        a batch (built by ``residual.batch``).

        Arguments:
            residual: the `PointResidual` whose group `weigh` wrapped.
            model: the model being fitted.
            inputs: the batch's points.
            targets: the batch's targets.

        Returns:
            The new weights, ``(M,)`` (also kept in `weights`).

        Raises:
            ValueError: ``residual`` has no group of this name.
        """
        names = [g.name for g in residual.groups]
        if self.group not in names:
            raise ValueError(
                message(
                    f"a group {self.group!r} to weigh causally was expected",
                    f"{residual!r} has the groups {names}",
                    "pass CausalWeights(..., group=<the equation's group>)",
                )
            )
        picked = targets[:, 0].detach().to("cpu", torch.int64) == names.index(self.group)
        x, y = inputs[picked.to(inputs.device)], targets[picked.to(targets.device)]
        params: Mapping[str, torch.Tensor] = {k: v.detach() for k, v in model.named_parameters()}
        saved, self.weights = self.weights, torch.ones_like(self.weights)
        try:
            with torch.no_grad():
                r = residual.rows(model, params, x, y)  # unweighted: all weights one
        finally:
            self.weights = saved
        squares = r.detach().to("cpu", torch.float64).pow(2).sum(1)
        bins = self.bin_of(x[:, self.time].detach().to("cpu", torch.float64)).to(torch.int64)
        total = torch.zeros(self.bins, dtype=torch.float64).index_add_(0, bins, squares)
        count = torch.zeros(self.bins, dtype=torch.float64).index_add_(
            0, bins, torch.ones_like(squares)
        )
        loss = total / count.clamp_min(1.0)
        before = torch.cumsum(loss, 0) - loss  # Σ_{k<i} L_k
        self.weights = torch.exp(-self.epsilon * before)
        return self.weights

    def anneal(self, schedule: Sequence[float], tolerance: float = 0.99) -> bool:
        """Raise ``ε`` to the next value of ``schedule`` above it once every weight exceeds
        ``tolerance`` (the weights of the last `update`): the annealed tolerance of Wang,
        Sankaran & Perdikaris 2022 (their schedule 1e-2, 1e-1, 1, 10, 100; δ = 0.99).

        Arguments:
            schedule: increasing values of ``ε``.
            tolerance: ``δ``; the smallest weight must exceed it.

        Returns:
            Whether ``ε`` was raised (False at the end of the schedule).
        """
        if float(self.weights.min()) <= tolerance:
            return False
        above = [float(e) for e in schedule if float(e) > self.epsilon]
        if not above:
            return False
        self.epsilon = min(above)
        return True
