"""LM on the free parameters, with the parameters that reach a bound held there.

The bounds l ≤ p ≤ u are kept by MINUIT's transform (``_curve.large.bounds``): every iterate is
feasible. Where the optimum lies on a bound, the transform's derivative φ'(q) vanishes
there, its quadratic model is poor, and λ grows until every parameter crawls (measured:
1000 steps without converging on a three-parameter decay with two bounds active). So,
as an active-set method does (Nocedal & Wright 2006, §16.5; Gill, Murray & Wright 1981,
§5.5), a parameter that comes within ``AT_BOUND`` of a bound (relative to the width of its
range, or to max(1, |bound|) for a one-sided bound) is held at that bound and LM goes on
over the others. When LM terminates, the first-order (KKT) conditions are checked from
the gradient ∇C of the cost (``_curve.large.point``): a parameter held at its lower bound with
∂C/∂p_j < 0 (or at its upper bound with ∂C/∂p_j > 0) would lower the cost by moving
inside, so it is released, for good, and LM resumes. Each round holds or releases at least
one parameter, so there are at most 2P + 1 rounds.

Without bounds, LM may hand over to Gauss-Newton (``Tolerances.handoff``): after an
accepted step that lowered the cost by at most ``handoff`` relative while its quadratic
model held (gain ratio within ``HANDOFF_RATIO`` of 1), the point is where Gauss-Newton
converges, and the step LM would take next (a Jacobian pass and a trial whose decrease is
below rounding) is left to the QR-based corrections of ``_curve.large.point.polish``; the same
LM goes on when those cannot finish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from ..._lm.lma import LMA
from ..._lm.report import StepReport
from .bounds import Bounds
from .inputs import CurveInputs
from .model import CurveModel, curve_residual_fn
from .point import PointPasses

__all__ = [
    "AT_BOUND",
    "CURVE_LMA_OPTIONS",
    "HANDOFF_RATIO",
    "HANDOFF_TRIES",
    "Solved",
    "bound_sides",
    "solve",
]

#: A parameter this close to a bound (relative to its range) is held there.
AT_BOUND = 1e-7
#: A step hands over to Gauss-Newton only when its gain ratio is within this of 1.
HANDOFF_RATIO = 0.1
#: Hand-overs tried per fit: each one that Gauss-Newton cannot finish costs a Jacobian
#: pass, and a fit that crawls along a valley meets the test at many steps.
HANDOFF_TRIES = 2

#: The ``LMA`` options of every curve fit, chosen on the NIST StRD problems from both of
#: their starts (``benchmarks/bench_nist.py``; docs/algorithm.md, "Poor starts"): a
#: scaling that remembers its last D at half weight (MINPACK's running maximum, decaying),
#: and geodesic acceleration (α = 0.75) from the 20th step, so that fits that converge in
#: fewer steps pay nothing for it. Read-only: a fit passes its own (``solve(lma_options=...)``).
CURVE_LMA_OPTIONS: Mapping[str, object] = MappingProxyType(
    {
        "damping_min": 1e-12,
        "scaling_memory": 0.5,
        "geodesic": 0.75,
        "geodesic_after": 20,
    }
)


@dataclass(frozen=True)
class Solved:
    """Where LM ended: p (float64, CPU), which parameters are free (the others held at a
    bound), the number of steps, whether the last run terminated (or handed over to
    Gauss-Newton: ``handed_off``), and its last report."""

    params: torch.Tensor
    free: torch.Tensor
    steps: int
    terminated: bool
    report: StepReport | None
    handed_off: bool = False


@dataclass(frozen=True)
class Tolerances:
    """MINPACK's stopping tests handed to each ``LMA``, the step budget, and the relative
    decrease at which LM hands over to Gauss-Newton (None: never; module docstring)."""

    ftol: float | None
    xtol: float | None
    gtol: float | None
    max_steps: int
    handoff: float | None = None


def _hands_off(report: StepReport | None, handoff: float | None) -> bool:
    """Whether this accepted step lowered the cost by at most ``handoff`` relative with
    its quadratic model holding."""
    if handoff is None or report is None or not report.accepted or report.loss_before <= 0:
        return False
    decrease = (report.loss_before - report.loss_after) / report.loss_before
    return decrease <= handoff and abs(report.gain_ratio - 1.0) <= HANDOFF_RATIO


def bound_sides(p: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """−1 where p is within ``AT_BOUND`` of its lower bound, +1 of its upper bound, else 0."""
    lo_f, hi_f = torch.isfinite(lower), torch.isfinite(upper)
    lo = torch.where(lo_f, lower, torch.zeros_like(lower))
    hi = torch.where(hi_f, upper, torch.zeros_like(upper))
    one_sided = torch.clamp(torch.maximum(lo.abs(), hi.abs()), min=1.0)
    scale = torch.where(lo_f & hi_f, hi - lo, one_sided)
    near_lo = lo_f & (p - lo <= AT_BOUND * scale)
    near_hi = hi_f & (hi - p <= AT_BOUND * scale)
    sides = torch.zeros(p.shape, dtype=torch.int64)
    sides = torch.where(near_lo, -1, sides)
    return torch.where(near_hi, 1, sides)


def _model(
    f: Callable[..., torch.Tensor], p: torch.Tensor, free: torch.Tensor, data: CurveInputs
) -> CurveModel:
    sub = Bounds(data.lower[free], data.upper[free])
    start = sub.to_internal(p[free]) if sub.active else p[free]
    return CurveModel(
        f,
        start.to(data.device, data.dtype),
        bounds=sub if sub.active else None,
        held=p.to(data.device, data.dtype),
        free=free.to(data.device),
        samples_last=data.samples_last,
    )


def solve(
    f: Callable[..., torch.Tensor],
    data: CurveInputs,
    *,
    limits: Tolerances,
    passes: PointPasses,
    finish: Callable[[torch.Tensor, torch.Tensor], bool] | None = None,
    lma_options: Mapping[str, object] | None = None,
) -> Solved:
    """Run LM from ``data.p0`` until it terminates with the KKT conditions met, or the
    step budget is spent (module docstring).

    ``passes`` gives the gradient of the cost for the first-order test at the bounds, and
    the fit's loss, its scale and the slices of the data.
    ``finish(p, free)`` is asked at a point where LM may hand over (``limits.handoff``)
    whether Gauss-Newton finishes from there; when it does not, the same LM goes on (at
    most ``HANDOFF_TRIES`` such questions per fit). ``lma_options``: ``LMA`` keywords over
    ``CURVE_LMA_OPTIONS``.
    """
    options = {**CURVE_LMA_OPTIONS, **(lma_options or {})}
    count = data.p0.numel()
    tries = HANDOFF_TRIES if finish is not None else 0
    bounded = Bounds(data.lower, data.upper).active
    p = Bounds(data.lower, data.upper).interior(data.p0) if bounded else data.p0.clone()
    free = torch.ones(count, dtype=torch.bool)
    released = torch.zeros(count, dtype=torch.bool)
    sides = torch.zeros(count, dtype=torch.int64)
    residual_fn = curve_residual_fn(passes.loss, passes.f_scale)
    slice_size = passes.slice_size
    steps, terminated, report = 0, False, None
    for _ in range(2 * count + 1):
        holding = torch.zeros(count, dtype=torch.bool)
        if bool(free.any()):
            model = _model(f, p, free, data)
            lma = LMA(
                model,
                [data.device],
                residual_fn,
                ftol=limits.ftol,
                xtol=limits.xtol,
                gtol=limits.gtol,
                jacobian_mode="broadcast",
                **options,  # type: ignore[arg-type]
            )
            terminated = False
            while steps < limits.max_steps and not terminated:
                _, terminated = lma.step(data.x, data.targets, slice_size)
                steps += 1
                report = lma.report
                with torch.no_grad():
                    p = model.external().detach().to("cpu", torch.float64)
                if tries and not bounded and not terminated and _hands_off(report, limits.handoff):
                    assert finish is not None
                    if finish(p, free):
                        return Solved(p, free, steps, True, report, handed_off=True)
                    tries -= 1
                if bounded:
                    near = bound_sides(p, data.lower, data.upper)
                    holding = (near != 0) & free & ~released
                    if bool(holding.any()):
                        sides = torch.where(holding, near, sides)
                        break
            if bool(holding.any()):
                # Held exactly at the bound it reached.
                p = torch.where(holding & (sides < 0), data.lower, p)
                p = torch.where(holding & (sides > 0), data.upper, p)
                free &= ~holding
                terminated = False
                continue
            if not terminated:
                break
        else:
            terminated = True
        if bool(free.all()):
            break
        gradient = passes.at(p).gradient
        inward = ~free & (((sides < 0) & (gradient < 0)) | ((sides > 0) & (gradient > 0)))
        if not bool(inward.any()):
            break
        free |= inward
        released |= inward
        sides = torch.where(inward, 0, sides)
        p = Bounds(data.lower, data.upper).interior(p)
    return Solved(params=p, free=free, steps=steps, terminated=terminated, report=report)
