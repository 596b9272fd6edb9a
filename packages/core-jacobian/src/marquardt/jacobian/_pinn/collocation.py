"""Collocation points drawn afresh as training goes: `Collocation`.

A physics-informed network fitted at fixed collocation points minimises the residual at
those points only. With fewer rows than parameters the Levenberg-Marquardt fit can
drive every row to zero and interpolate them, and the error between the points stops
falling. Drawing fresh points every ``every`` steps turns the objective into a Monte
Carlo estimate of ∫ r(x)² dx over the domain, which no finite set of points can
interpolate (random resampling, Wu et al. 2023, "A comprehensive study of non-adaptive
and residual-based adaptive sampling for physics-informed neural networks", CMAME 403).

Residual-weighted points (``power > 0``): ``candidates · n`` points are drawn, and ``n``
of them are kept without replacement with probability

    p(x) ∝ |r(x)|^k / mean |r|^k + c        (k = ``power``, c = ``floor``),

the residual-based adaptive distribution (RAD) of Wu et al. 2023, so the points gather
where the residual is large while every part of the domain keeps a chance (c > 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn
from torch.utils.data import IterableDataset

from .._errors import message
from .._points import PointResidual

__all__ = ["Collocation", "Sampler"]

#: ``sampler(n, generator)`` returns ``n`` points ``(n, d)`` or ``(points, targets)``.
Sampler = Callable[[int, torch.Generator], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
Drawn = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def _replace(old: Drawn, slots: torch.Tensor, new: Drawn) -> Drawn:
    """``old`` with the points (and targets) at ``slots`` replaced by ``new``'s."""
    if isinstance(old, tuple) and isinstance(new, tuple):
        x, y = old[0].clone(), old[1].clone()
        x[slots], y[slots] = new[0], new[1]
        return x, y
    assert isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)
    x = old.clone()
    x[slots] = new
    return x


class Collocation(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Batches of a `PointResidual` at collocation points redrawn every ``every`` batches.

    Iterate it (or ``DataLoader(collocation, batch_size=None)`` for a ``Trainer``) for
    ``(inputs, targets)`` batches without end, or call `draw` for one.

    Residual weighting (``power``, ``floor``, ``candidates``) is described in the module
    docstring. A sampler that returns another number of points than asked fails at the
    draw.

    Arguments:
        residual: the `PointResidual` whose batches are built.
        samplers: for each group name, ``sampler(n, generator)`` returning ``n`` points,
            or ``(points, targets)``.
        rows: the number of points of each group per batch.
        every: batches served from one draw (1: new points for every step).
        refresh: the fraction of each group's points a draw after the first replaces
            (chosen at random; 1: all of them). Replacing a quarter at every step keeps
            most of the points a step fits and still sweeps the domain.
        power: the exponent ``k`` of the residual weighting; 0 (the default) draws
            uniformly from the samplers.
        floor: the constant ``c`` that keeps every part of the domain a chance.
        candidates: points drawn per point kept, when ``power > 0``.
        model: the model whose residual weights the points (needed when ``power > 0``).
        seed: the seed of the draws.

    Raises:
        TypeError: ``residual`` is not a `PointResidual`.
        ValueError: a group without a sampler or count, a name the residual does not
            have, a count below 1, ``every`` or ``candidates`` below 1, a negative
            ``power`` or ``floor``, a ``refresh`` outside (0, 1], or ``power > 0`` without
            a model.
    """

    def __init__(
        self,
        residual: PointResidual,
        samplers: Mapping[str, Sampler],
        rows: Mapping[str, int],
        *,
        every: int = 1,
        refresh: float = 0.25,
        power: float = 0.0,
        floor: float = 1.0,
        candidates: int = 4,
        model: nn.Module | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(residual, PointResidual):
            raise TypeError(
                message(
                    "Collocation(residual, ...) expects a PointResidual",
                    f"got {type(residual).__name__}",
                    "pass PointResidual(ResidualGroup(name, fn), ...)",
                )
            )
        names = {g.name for g in residual.groups}
        unknown = sorted((set(samplers) | set(rows)) - names)
        if unknown:
            raise ValueError(
                message(
                    f"samplers and rows for the groups {sorted(names)} were expected",
                    f"got {unknown}, which {residual!r} does not have",
                    "name each sampler and count after a ResidualGroup",
                )
            )
        if set(samplers) != set(rows) or not samplers:
            raise ValueError(
                message(
                    "a sampler and a count of rows for each group drawn were expected",
                    f"got samplers for {sorted(samplers)} and rows for {sorted(rows)}",
                    "pass the same group names to samplers= and rows=",
                )
            )
        bad = {k: v for k, v in rows.items() if not isinstance(v, int) or v < 1}
        for what, value, ok in (
            ("rows", bad, not bad),
            ("every", every, isinstance(every, int) and every >= 1),
            ("refresh", refresh, 0.0 < refresh <= 1.0),
            ("candidates", candidates, isinstance(candidates, int) and candidates >= 1),
            ("power", power, power >= 0.0),
            ("floor", floor, floor >= 0.0),
        ):
            if not ok:
                raise ValueError(
                    message(
                        f"Collocation({what}=...) within its range was expected",
                        f"got {value!r}",
                        "rows, every and candidates are integers ≥ 1; power and floor ≥ 0",
                    )
                )
        if power > 0 and model is None:
            raise ValueError(
                message(
                    f"residual-weighted points (power={power}) were requested",
                    "no model was given to evaluate the residual",
                    "pass model=... (the model being trained), or power=0 for uniform draws",
                )
            )
        self.residual = residual
        self.samplers = dict(samplers)
        self.rows = dict(rows)
        self.every = every
        self.refresh = float(refresh)
        self.power = float(power)
        self.floor = float(floor)
        self.candidates = candidates
        self.model = model
        self.generator = torch.Generator().manual_seed(seed)
        self.draws = 0
        self._served = 0
        self._current: tuple[torch.Tensor, torch.Tensor] | None = None
        self._points: dict[str, Drawn] = {}

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The current batch, redrawn when it has served ``every`` batches."""
        if self._current is None or self._served % self.every == 0:
            self._current = self.draw()
        self._served += 1
        return self._current

    def draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A new batch ``(inputs, targets)``: the first draws every point, later ones
        replace a ``refresh`` fraction of each group's points (chosen at random)."""
        for name, n in self.rows.items():
            old = self._points.get(name)
            if old is None or self.refresh == 1.0:
                self._points[name] = self._group(name, n)
                continue
            k = max(1, round(self.refresh * n))
            slots = torch.randperm(n, generator=self.generator)[:k]
            new = self._group(name, k)
            self._points[name] = _replace(old, slots, new)
        self.draws += 1
        return self.residual.batch(**self._points)

    def _sample(self, name: str, n: int) -> Drawn:
        drawn = self.samplers[name](n, self.generator)
        x = drawn[0] if isinstance(drawn, tuple) else drawn
        if int(x.shape[0]) != n:
            raise ValueError(
                message(
                    f"the sampler of group {name!r} was asked for {n} points",
                    f"it returned {int(x.shape[0])}",
                    "return exactly n points (and as many targets) from sampler(n, generator)",
                )
            )
        return drawn

    def _group(self, name: str, n: int) -> Drawn:
        if self.power == 0.0:
            return self._sample(name, n)
        drawn = self._sample(name, n * self.candidates)
        size = self._residual_size(name, drawn)
        weight = size.pow(self.power)
        p = weight / weight.mean().clamp_min(torch.finfo(weight.dtype).tiny) + self.floor
        if not bool(torch.isfinite(p).all()) or float(p.sum()) <= 0:
            p = torch.ones_like(p)  # a non-finite residual: fall back to uniform draws
        keep = torch.multinomial(p, n, replacement=False, generator=self.generator)
        if isinstance(drawn, tuple):
            return drawn[0][keep], drawn[1][keep]
        return drawn[keep]

    def _residual_size(self, name: str, drawn: Drawn) -> torch.Tensor:
        """|r| of each candidate of group ``name`` under the current model (on the CPU)."""
        model = self.model
        assert model is not None  # checked in __init__
        x, y = self.residual.batch(**{name: drawn})
        params = {k: v.detach() for k, v in model.named_parameters()}
        device = next(iter(params.values())).device if params else x.device
        with torch.no_grad():
            r = self.residual.rows(model, params, x.to(device), y.to(device))
        size: torch.Tensor = r.reshape(int(r.shape[0]), -1).norm(dim=1)
        return size.to("cpu", torch.float64)
