"""curve_fit_result on a CUDA device gives the CPU's results to 1e-10 in float64.

Both runs end with the same Gauss-Newton correction from the QR factor of J at p̂
(float64, on the CPU), so they agree to rounding (≈ κ(J)·ε relative) even though the
device sums in another order. Every option that changes the path is covered: σ weights
and ``absolute_sigma``, bounds with the optimum inside and on a bound (the active set),
each robust loss, data handed over on the device, and a million points (many slices).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from curve_problems import curve_problem, numpy_model

from marquardt.solver import curve_fit_result
from marquardt.solver._lm.robust import ROBUST_LOSSES
from marquardt.testing.curves import decay

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

RTOL = 1e-10


def _same(gpu: object, cpu: object) -> None:
    """Equal to RTOL relative to each array's largest entry: an entry that vanishes by the
    problem's symmetry (cov(μ, s) of a Gaussian centred in its x) is rounding on both sides,
    and its relative difference says nothing."""
    for field in ("popt", "pcov"):
        got, want = getattr(gpu, field), getattr(cpu, field)
        assert got.device.type == "cpu" and got.dtype == torch.float64
        scale = float(want.abs().max())
        torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL * scale)


def _gaussian(x: torch.Tensor, a: object, mu: object, s: object, c: object) -> torch.Tensor:
    return a * torch.exp(-0.5 * ((x - mu) / s) ** 2) + c  # type: ignore[operator]


@pytest.mark.parametrize("name", ["gaussian", "surface_2d", "misra1a", "two_exp"])
@pytest.mark.parametrize("weighting", ["none", "sigma", "absolute"])
def test_problems_match_cpu(name: str, weighting: str) -> None:
    prob = curve_problem(name)
    kwargs: dict[str, object] = {}
    if weighting != "none":
        kwargs = {"sigma": prob.sigma, "absolute_sigma": weighting == "absolute"}
    cpu = curve_fit_result(prob.f, prob.x, prob.y, prob.p0, **kwargs)
    gpu = curve_fit_result(prob.f, prob.x, prob.y, prob.p0, device="cuda", **kwargs)
    _same(gpu, cpu)


@pytest.mark.parametrize(
    "bounds",
    [([0.0, 0.0, 0.0], [10.0, 5.0, 2.0]), ([0.0, 0.0, 0.6], [10.0, 1.2, 2.0])],
    ids=["inside", "on_bounds"],
)
def test_bounds_match_cpu(bounds: tuple[list[float], list[float]]) -> None:
    x = np.linspace(0.0, 4.0, 60)
    y = numpy_model(decay)(x, 2.5, 1.3, 0.5) + 0.02 * np.random.default_rng(1).standard_normal(60)
    cpu = curve_fit_result(decay, x, y, [1.0, 0.5, 1.0], bounds=bounds)
    gpu = curve_fit_result(decay, x, y, [1.0, 0.5, 1.0], bounds=bounds, device="cuda")
    _same(gpu, cpu)


@pytest.mark.parametrize("loss", [name for name in ROBUST_LOSSES if name != "linear"])
def test_robust_losses_match_cpu(loss: str) -> None:
    rng = np.random.default_rng(3)
    x = np.linspace(0.0, 4.0, 80)
    y = numpy_model(decay)(x, 2.5, 1.3, 0.5) + 0.02 * rng.standard_normal(80)
    y[::9] += 1.5  # outliers
    kwargs = {"loss": loss, "f_scale": 0.1}
    cpu = curve_fit_result(decay, x, y, [1.0, 0.5, 1.0], **kwargs)  # type: ignore[arg-type]
    gpu = curve_fit_result(decay, x, y, [1.0, 0.5, 1.0], device="cuda", **kwargs)  # type: ignore[arg-type]
    _same(gpu, cpu)


def test_a_million_points_handed_over_on_the_device() -> None:
    rng = np.random.default_rng(4)
    x = np.linspace(-5.0, 5.0, 1_000_000)
    y = numpy_model(_gaussian)(x, 2.0, 0.3, 0.8, 0.5) + 0.05 * rng.standard_normal(x.size)
    p0 = [1.0, 0.0, 1.0, 0.0]
    cpu = curve_fit_result(_gaussian, x, y, p0)
    xt = torch.from_numpy(x).cuda()
    yt = torch.from_numpy(y).cuda()
    gpu = curve_fit_result(_gaussian, xt, yt, p0)  # device: where x is
    _same(gpu, cpu)
    assert gpu.residuals.device.type == "cpu"
