"""Bounds: every iterate feasible, and the optimum of scipy's "trf", inside and on a bound.

The transform (``_bounds``) alone converges slowly onto a bound; the active set
(``_active_set``) holds a parameter that reaches one. Against ``least_squares(method=
"trf")`` with an exact Jacobian and tolerances at 1e-15, popt agrees within 1e-9
relative and pcov within 1e-6 of √(pcov_ii·pcov_jj), inside and on bounds.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from curve_problems import numpy_jacobian, numpy_model

from marquardt.solver import curve_fit_result
from marquardt.solver._curve.large.active_set import AT_BOUND, bound_sides
from marquardt.solver._curve.large.bounds import Bounds
from marquardt.testing.curves import decay, popt_pcov

INF = np.inf


X = np.linspace(0.0, 4.0, 60)
Y = numpy_model(decay)(X, 2.5, 1.3, 0.5) + 0.02 * np.random.default_rng(1).standard_normal(60)
P0 = [1.0, 0.5, 1.0]

CASES = [
    ("inside, both sides", ([0, 0, 0], [10, 5, 2]), ()),
    ("inside, one-sided", ([0, 0.2, -INF], [INF, INF, INF]), ()),
    ("two on bounds", ([0, 0, 0.6], [10, 1.2, 2]), (1, 2)),
    ("on an upper bound only", ([-INF, -INF, -INF], [INF, 1.1, INF]), (1,)),
    ("on a lower bound only", ([-INF, 1.4, -INF], [INF, INF, INF]), (1,)),
]


def _trf(bounds: tuple[list[float], list[float]], p0: list[float]) -> tuple[np.ndarray, np.ndarray]:
    from scipy.optimize import curve_fit as scipy_curve_fit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return scipy_curve_fit(  # type: ignore[no-any-return]
            numpy_model(decay),
            X,
            Y,
            p0,
            jac=numpy_jacobian(decay),
            bounds=bounds,
            method="trf",
            ftol=1e-15,
            xtol=1e-15,
            gtol=1e-15,
            max_nfev=10_000,
        )


@pytest.mark.parametrize(("bounds", "active"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bounded_fit_matches_trf(
    bounds: tuple[list[float], list[float]], active: tuple[int]
) -> None:
    p0 = [max(v, lo + 0.1) if np.isfinite(lo) else v for v, lo in zip(P0, bounds[0], strict=True)]
    p0 = [min(v, hi - 0.1) if np.isfinite(hi) else v for v, hi in zip(p0, bounds[1], strict=True)]
    popt_ref, pcov_ref = _trf(bounds, p0)
    result = curve_fit_result(decay, X, Y, p0, bounds=bounds)
    assert result.success, result.reason
    np.testing.assert_allclose(result.popt.numpy(), popt_ref, rtol=1e-9, atol=0)
    scale = np.sqrt(np.outer(np.diag(pcov_ref), np.diag(pcov_ref)))
    assert np.max(np.abs(result.pcov.numpy() - pcov_ref) / scale) <= 1e-6
    lower, upper = (np.broadcast_to(np.asarray(b, float), (3,)) for b in bounds)
    # trf stays strictly inside; within 1e-8 of a bound is on it.
    gap = np.minimum(np.abs(popt_ref - lower), np.abs(popt_ref - upper))
    assert tuple(np.flatnonzero(gap <= 1e-8)) == active  # the case is what its name says
    for j in active:  # held exactly at the bound
        assert result.popt[j].item() in (lower[j], upper[j])


def test_every_iterate_is_feasible() -> None:
    """f records every parameter vector it is called with (LM trial points included)."""
    seen: list[torch.Tensor] = []

    def watched(x: torch.Tensor, *p: torch.Tensor) -> torch.Tensor:
        if not torch._C._functorch.is_functorch_wrapped_tensor(p[0]):  # plain evaluations
            # One row per parameter vector: p holds scalars, or one value per point when
            # the Jacobian pass gives each point its own copy of the parameters.
            seen.append(torch.stack([v.detach().reshape(-1) for v in p]).T)
        return decay(x, *p)

    lower, upper = [0.0, 0.0, 0.6], [10.0, 1.2, 2.0]
    popt_pcov(watched, X, Y, [1.0, 0.5, 1.0], bounds=(lower, upper))
    values = torch.cat(seen)
    assert len(seen) > 10
    assert bool((values >= torch.tensor(lower, dtype=torch.float64)).all())
    assert bool((values <= torch.tensor(upper, dtype=torch.float64)).all())


def test_transform_round_trip_and_range() -> None:
    lower = torch.tensor([0.0, -INF, 1.0, -INF], dtype=torch.float64)
    upper = torch.tensor([2.0, 5.0, INF, INF], dtype=torch.float64)
    bounds = Bounds(lower, upper)
    p = torch.tensor([0.3, -7.0, 4.0, 123.0], dtype=torch.float64)
    torch.testing.assert_close(bounds.to_external(bounds.to_internal(p)), p)
    q = torch.linspace(-50, 50, 1001, dtype=torch.float64).unsqueeze(1).expand(-1, 4)
    mapped = torch.stack([bounds.to_external(row) for row in q])
    assert bool((mapped >= lower).all()) and bool((mapped <= upper).all())
    # A start on a bound is moved inside, where the transform has a derivative.
    start = bounds.interior(torch.tensor([0.0, 5.0, 1.0, 0.0], dtype=torch.float64))
    assert bool((start > lower).all()) and bool((start < upper).all())


def test_bound_sides() -> None:
    lower = torch.tensor([0.0, 0.0, -INF], dtype=torch.float64)
    upper = torch.tensor([1.0, 1.0, 3.0], dtype=torch.float64)
    p = torch.tensor([0.5 * AT_BOUND, 1.0 - 2.0 * AT_BOUND, 3.0 - 2.0 * AT_BOUND])
    assert bound_sides(p.double(), lower, upper).tolist() == [-1, 0, 1]
