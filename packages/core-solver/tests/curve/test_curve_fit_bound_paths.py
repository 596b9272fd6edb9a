"""``curve_fit``'s two bound semantics reach the same constrained minimum.

The small path projects onto the bounds; the sliced engine (here chosen by its
``slice_size`` keyword, as a fit of more than ``SMALL_POINTS`` points or on a GPU chooses
it) keeps them by a change of variables. On a decay with the optimum inside, on a lower
bound and on an upper bound, both hold the same parameters on their bounds and agree on
the cost to 1e-10 and on the parameters to 1e-6 (the valley along a bound is flat).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marquardt.solver import curve_fit

TIGHT = {"ftol": 1e-12, "xtol": 1e-12, "gtol": 1e-12}


def _decay(x: torch.Tensor, a: torch.Tensor, k: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return a * torch.exp(-k * x) + c


@pytest.mark.parametrize(
    ("lower", "upper", "p0", "on_bound"),
    [
        ([0.0, 0.0, -1.0], [10.0, 10.0, 10.0], [1.0, 1.0, 0.5], []),
        ([0.0, 0.0, 0.3], [10.0, 10.0, 10.0], [1.0, 1.0, 0.5], [2]),
        ([0.0, 1.5, -1.0], [10.0, 10.0, 10.0], [1.0, 2.0, 0.5], [1]),
        ([0.0, 0.0, -1.0], [1.5, 10.0, 10.0], [1.0, 1.0, 0.5], [0]),
    ],
    ids=["inside", "lower_c", "lower_k", "upper_a"],
)
def test_projection_and_transform_reach_the_same_minimum(
    lower: list[float], upper: list[float], p0: list[float], on_bound: list[int]
) -> None:
    rng = np.random.default_rng(5)
    x = np.linspace(0.0, 4.0, 400)
    y = 2.0 * np.exp(-1.3 * x) + 0.2 + 0.02 * rng.standard_normal(x.size)
    bounds = (lower, upper)
    small = curve_fit(_decay, x, y, p0, bounds=bounds, full_output=True, **TIGHT)
    sliced = curve_fit(_decay, x, y, p0, bounds=bounds, full_output=True, slice_size=100, **TIGHT)
    assert "njev" in small[2] and "njev" not in sliced[2], "the two paths ran"
    p_small, p_sliced = small[0], sliced[0]
    for popt in (p_small, p_sliced):
        at = np.isclose(popt, lower, rtol=0, atol=1e-12) | np.isclose(
            popt, upper, rtol=0, atol=1e-12
        )
        assert np.flatnonzero(at).tolist() == on_bound
        assert np.all(popt >= np.array(lower)) and np.all(popt <= np.array(upper))
    cost_small = 0.5 * float(np.sum(small[2]["fvec"] ** 2))
    cost_sliced = 0.5 * float(np.sum(sliced[2]["fvec"] ** 2))
    assert cost_small == pytest.approx(cost_sliced, rel=1e-10)
    np.testing.assert_allclose(p_small, p_sliced, rtol=1e-6)
