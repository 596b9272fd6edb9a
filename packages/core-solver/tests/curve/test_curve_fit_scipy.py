"""curve_fit behaves as scipy.optimize.curve_fit (SciPy 1.17's documentation), for models
written with NumPy and with torch: its returns (popt, pcov, full_output), where they live,
the forms of sigma, p0 and bounds, and the covariance warnings, each checked against SciPy
itself where SciPy gives a number. Its methods and Jacobians are in
``test_curve_fit_scipy_jac.py``, its input forms and refusals in
``test_curve_fit_scipy_inputs.py``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from scipy_cases import KINDS, POPT_RTOL, RNG, SIGMA, X, Y, decay, exact_pcov, reference

from marquardt.solver import CovarianceWarning, OptimizeWarning, curve_fit

scipy_optimize = pytest.importorskip("scipy.optimize")


@pytest.mark.parametrize("kind", KINDS)
def test_popt_matches_scipy_and_pcov_is_the_exact_covariance(kind: str) -> None:
    popt, pcov = curve_fit(decay(kind), X, Y, p0=[1.0, 1.0, 0.0])
    ref_popt, ref_pcov = reference(p0=[1.0, 1.0, 0.0])
    np.testing.assert_allclose(popt, ref_popt, rtol=POPT_RTOL[kind])
    # SciPy's "lm" pcov comes from the last J MINPACK formed, one step before p̂ (here
    # 1e-4 from the exact covariance); ours from J at p̂.
    np.testing.assert_allclose(pcov, exact_pcov(popt), rtol=1e-6)
    np.testing.assert_allclose(pcov, ref_pcov, rtol=1e-3)


@pytest.mark.parametrize("kind", KINDS)
def test_numpy_in_numpy_float64_out(kind: str) -> None:
    popt, pcov = curve_fit(decay(kind), X.astype(np.float32), list(Y), p0=[1.0, 1.0, 0.0])
    assert isinstance(popt, np.ndarray) and popt.dtype == np.float64 and popt.shape == (3,)
    assert isinstance(pcov, np.ndarray) and pcov.dtype == np.float64 and pcov.shape == (3, 3)


def test_torch_in_torch_out_on_the_data_device() -> None:
    popt, pcov = curve_fit(decay("torch"), torch.from_numpy(X), torch.from_numpy(Y), [1, 1, 0])
    assert isinstance(popt, torch.Tensor) and popt.dtype == torch.float64
    assert isinstance(pcov, torch.Tensor) and pcov.device == torch.device("cpu")
    np.testing.assert_allclose(popt.numpy(), reference(p0=[1, 1, 0])[0], rtol=POPT_RTOL["torch"])


@pytest.mark.gpu
def test_torch_on_cuda_comes_back_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x, y = torch.from_numpy(X).cuda(), torch.from_numpy(Y).cuda()
    popt, pcov = curve_fit(decay("torch"), x, y, [1.0, 1.0, 0.0])
    assert popt.device.type == "cuda" and pcov.device.type == "cuda"


@pytest.mark.parametrize("kind", KINDS)
def test_sigma_is_the_fifth_positional_argument(kind: str) -> None:
    popt, pcov = curve_fit(decay(kind), X, Y, [1.0, 1.0, 0.0], SIGMA, True)
    ref = reference(p0=[1.0, 1.0, 0.0], sigma=SIGMA, absolute_sigma=True)
    np.testing.assert_allclose(popt, ref[0], rtol=POPT_RTOL[kind])
    np.testing.assert_allclose(pcov, exact_pcov(popt, SIGMA, absolute=True), rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_scalar_sigma_is_one_sigma_per_point(kind: str) -> None:
    for absolute in (False, True):
        _, scalar = curve_fit(decay(kind), X, Y, [1, 1, 0], sigma=0.3, absolute_sigma=absolute)
        _, full = curve_fit(
            decay(kind), X, Y, [1, 1, 0], sigma=np.full(50, 0.3), absolute_sigma=absolute
        )
        np.testing.assert_allclose(scalar, full, rtol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_covariance_sigma_whitens_with_its_cholesky_factor(kind: str) -> None:
    a = RNG.normal(size=(50, 50))
    cov = a @ a.T / 50 + np.eye(50) * 0.01
    popt, pcov = curve_fit(decay(kind), X, Y, [1.0, 1.0, 0.0], sigma=cov)
    ref = reference(p0=[1.0, 1.0, 0.0], sigma=cov)
    np.testing.assert_allclose(popt, ref[0], rtol=1e-5)
    np.testing.assert_allclose(pcov, ref[1], rtol=1e-3)
    _, diagonal = curve_fit(decay(kind), X, Y, [1, 1, 0], sigma=np.diag(SIGMA**2))
    _, vector = curve_fit(decay(kind), X, Y, [1, 1, 0], sigma=SIGMA)
    np.testing.assert_allclose(diagonal, vector, rtol=1.4e-7)  # SciPy's tolerance for this


@pytest.mark.parametrize("jac", [False, True])
@pytest.mark.parametrize("absolute", [False, True])
def test_rotated_covariance_sigma_gives_the_same_fit_with_a_torch_model(
    absolute: bool, jac: bool
) -> None:
    """SciPy's test_curvefit_covariance with torch models: σ per point against the equal
    covariance matrix of the rotated data, to SciPy's tolerances."""
    rotation = np.array([[2**-0.5, -(2**-0.5), 0.0], [2**-0.5, 2**-0.5, 0.0], [0.0, 0.0, 1.0]])
    rt = torch.from_numpy(rotation)

    def f(x: Any, a: Any, b: Any) -> Any:
        return a * torch.exp(-b * x)

    def rotated(x: Any, a: Any, b: Any) -> Any:
        return rt @ f(x, a, b)

    def jf(x: Any, a: float, b: float) -> np.ndarray:
        e = np.exp(-b * x)
        return np.stack([e, -a * x * e], axis=1)

    rng = np.random.default_rng(1234)
    x = np.arange(1.0, 4.0)
    y = 2.5 * np.exp(-x) + 0.2 * rng.standard_normal(3)
    sigma = np.full(3, 0.2)
    one = curve_fit(f, x, y, sigma=sigma, absolute_sigma=absolute, jac=jf if jac else None)
    two = curve_fit(
        rotated,
        x,
        rotation @ y,
        sigma=rotation @ np.diag(sigma**2) @ rotation.T,
        absolute_sigma=absolute,
        jac=(lambda x, a, b: rotation @ jf(x, a, b)) if jac else None,
    )
    np.testing.assert_allclose(one[0], two[0], rtol=1.4e-7, atol=1e-14)
    np.testing.assert_allclose(one[1], two[1], rtol=1.4e-7, atol=1e-14)


@pytest.mark.parametrize("kind", KINDS)
def test_p0_left_out_counts_parameters_and_starts_feasible(kind: str) -> None:
    bounds = (0, [3.0, 1.0, 0.5])  # SciPy's docstring example: b's optimum is past 1
    popt, _ = curve_fit(decay(kind), X, Y, bounds=bounds)
    ref = reference(bounds=bounds)[0]
    np.testing.assert_allclose(popt, ref, rtol=1e-5, atol=1e-8)
    assert popt[1] == pytest.approx(1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_bounds_object_equals_the_pair(kind: str) -> None:
    pair = curve_fit(decay(kind), X, Y, bounds=([0, 0, 0], [3, 1, 0.5]))[0]
    obj = curve_fit(decay(kind), X, Y, bounds=scipy_optimize.Bounds([0, 0, 0], [3, 1, 0.5]))[0]
    np.testing.assert_allclose(pair, obj, rtol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_indeterminate_covariance_warns_with_scipys_class(kind: str) -> None:
    x = np.arange(1.0, 7.0)
    y = np.array([1, 2, 3, 4, 5.5, 6])
    with pytest.warns(scipy_optimize.OptimizeWarning, match="could not be estimated"):
        _, pcov = curve_fit(lambda x, a, b: a * x, x, y)  # "lm": R is singular
    assert np.isinf(pcov).all()
    with pytest.warns(scipy_optimize.OptimizeWarning, match="could not be estimated"):
        _, pcov = curve_fit(lambda x, a, b: a * x + b, x[:2], y[:2])  # N = P
    assert np.isinf(pcov).all()
    assert issubclass(OptimizeWarning, scipy_optimize.OptimizeWarning)
    assert issubclass(CovarianceWarning, scipy_optimize.OptimizeWarning)


def test_rank_deficient_pcov_is_scipys_pseudo_inverse() -> None:
    x = np.linspace(0, 1, 20)
    y = 3.0 * x + 0.01 * np.sin(40 * x)

    def f(x: np.ndarray, a: float, b: float) -> np.ndarray:
        return (a + b) * x

    popt, ours = curve_fit(f, x, y, method="trf")
    j = np.stack([x, x], axis=1)  # rank 1: the pseudo-inverse keeps one singular value
    r = f(x, *popt) - y
    expected = np.linalg.pinv(j.T @ j) * float(r @ r) / (20 - 2)
    np.testing.assert_allclose(ours, expected, rtol=1e-6)


@pytest.mark.parametrize("method", [None, "trf"])
@pytest.mark.parametrize("kind", KINDS)
def test_full_output_is_scipys_five_tuple(kind: str, method: str | None) -> None:
    popt, pcov, info, mesg, ier = curve_fit(
        decay(kind), X, Y, [1, 1, 0], method=method, full_output=True
    )
    assert popt.shape == (3,) and pcov.shape == (3, 3)
    assert {"nfev", "fvec"} <= set(info) and info["fvec"].shape == (50,)
    if method is None:
        assert {"fjac", "ipvt", "qtf"} <= set(info)
    assert isinstance(mesg, str) and ier in (1, 2, 3, 4)
