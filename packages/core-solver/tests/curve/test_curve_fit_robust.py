"""Robust losses against scipy.optimize.least_squares(loss=...), and their definitions.

LM minimises the robust cost by IRLS rows (``_robust``): weights constant within a step,
where SciPy's "trf" uses the second-order correction. The stationary points are the same,
and the refinement after LM is SciPy's own step, so the optima agree: popt within 1e-7
relative of trf with an exact Jacobian and tolerances at 1e-15 (trf itself stops within
about 3e-8 there: restarted from our optimum it moves less than 1e-9), pcov within 1e-6 of
√(pcov_ii·pcov_jj).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from curve_problems import numpy_jacobian, numpy_model

from marquardt.solver import curve_fit_result
from marquardt.solver._lm.robust import ROBUST_LOSSES, rho, robust_rows
from marquardt.testing.curves import decay, popt_pcov

X = np.linspace(0.0, 4.0, 60)
Y = numpy_model(decay)(X, 2.5, 1.3, 0.5) + 0.02 * np.random.default_rng(1).standard_normal(60)
Y[::7] += 1.5  # outliers
SIGMA = 0.02 * (1.0 + np.random.default_rng(2).uniform(size=60))
P0 = [2.0, 1.0, 0.3]


def _trf(loss: str, f_scale: float, p0: list[float], sigma: np.ndarray | None) -> object:
    from scipy.optimize import curve_fit as scipy_curve_fit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return scipy_curve_fit(
            numpy_model(decay),
            X,
            Y,
            p0,
            sigma=sigma,
            jac=numpy_jacobian(decay),
            method="trf",
            loss=loss,
            f_scale=f_scale,
            ftol=1e-15,
            xtol=1e-15,
            gtol=1e-15,
            max_nfev=10_000,
        )


@pytest.mark.parametrize("f_scale", [0.1, 1.0])
@pytest.mark.parametrize("loss", [name for name in ROBUST_LOSSES if name != "linear"])
def test_robust_fit_matches_least_squares(loss: str, f_scale: float) -> None:
    sigma = SIGMA if f_scale == 1.0 else None
    popt_ref, pcov_ref = _trf(loss, f_scale, P0, sigma)  # type: ignore[misc]
    result = curve_fit_result(decay, X, Y, P0, sigma=sigma, loss=loss, f_scale=f_scale)
    assert result.success, result.reason
    np.testing.assert_allclose(result.popt.numpy(), popt_ref, rtol=1e-7, atol=0)
    restarted, _ = _trf(loss, f_scale, result.popt.tolist(), sigma)  # type: ignore[misc]
    # Huber's ρ has a kink in its second derivative at z = 1: near residuals on it, TRF's
    # restart moves by about 1e-9 relative on some CPUs' BLAS (1.02e-9 seen on an Intel Xeon).
    rtol = 1e-8 if loss == "huber" else 1e-9
    np.testing.assert_allclose(restarted, result.popt.numpy(), rtol=rtol, atol=0)
    scale = np.sqrt(np.outer(np.diag(pcov_ref), np.diag(pcov_ref)))
    assert np.max(np.abs(result.pcov.numpy() - pcov_ref) / scale) <= 1e-6


def test_robust_fit_resists_outliers() -> None:
    plain, _ = popt_pcov(decay, X, Y, P0)
    robust, _ = popt_pcov(decay, X, Y, P0, loss="soft_l1", f_scale=0.05)
    truth = torch.tensor([2.5, 1.3, 0.5], dtype=torch.float64)
    assert float((robust - truth).abs().max()) < 0.05 < float((plain - truth).abs().max())


def _scipy_rho(loss: str, z: np.ndarray) -> np.ndarray:
    """The definitions in SciPy's least_squares documentation."""
    if loss == "soft_l1":
        return 2.0 * (np.sqrt(1.0 + z) - 1.0)
    if loss == "huber":
        return np.where(z <= 1.0, z, 2.0 * np.sqrt(z) - 1.0)
    if loss == "cauchy":
        return np.log1p(z)
    if loss == "arctan":
        return np.arctan(z)
    return z


@pytest.mark.parametrize("loss", ROBUST_LOSSES)
def test_rho_and_its_derivatives(loss: str) -> None:
    z = torch.tensor([0.0, 0.3, 0.999, 1.001, 4.0, 250.0], dtype=torch.float64)
    value, first, second = rho(loss, z)
    np.testing.assert_allclose(value.numpy(), _scipy_rho(loss, z.numpy()), rtol=1e-14)
    zs = z.clone().requires_grad_(True)
    (d1,) = torch.autograd.grad(rho(loss, zs)[0].sum(), zs, create_graph=True)
    # ρ'' of the linear loss is a constant 0: d1 has no graph to differentiate.
    d2 = torch.autograd.grad(d1.sum(), zs)[0] if d1.requires_grad else torch.zeros_like(z)
    torch.testing.assert_close(first, d1.detach(), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(second, d2, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("loss", ROBUST_LOSSES)
def test_robust_rows_carry_the_cost_and_its_gradient(loss: str) -> None:
    """Σ rows² = c²ρ(z) exactly, and the rows' Jacobian gives J̃ᵀr̃ = ∇(½ Σ c²ρ)."""
    c = 0.7
    r = torch.tensor([-3.0, -0.2, 0.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    rows = robust_rows(r, loss, c)
    value, _, _ = rho(loss, (r.detach() / c) ** 2)
    torch.testing.assert_close((rows.detach() ** 2).sum(-1), c * c * value)
    jac = torch.autograd.functional.jacobian(lambda t: robust_rows(t, loss, c).reshape(-1), r)
    cost = lambda t: 0.5 * (c * c * rho(loss, (t / c) ** 2)[0]).sum()  # noqa: E731
    (gradient,) = torch.autograd.grad(cost(r), r)
    torch.testing.assert_close(jac.T @ rows.detach().reshape(-1), gradient)
