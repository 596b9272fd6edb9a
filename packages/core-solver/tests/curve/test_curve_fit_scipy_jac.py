"""curve_fit as scipy.optimize.curve_fit: the methods, the Jacobian schemes and callables,
the evaluation budget, robust losses, x_scale and diff_step, each against SciPy itself."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from scipy_cases import (
    KINDS,
    POPT_RTOL,
    X,
    Y,
    decay,
    numpy_decay,
    reference,
    two_parameter_decay,
)

from marquardt.solver import curve_fit

scipy_optimize = pytest.importorskip("scipy.optimize")


@pytest.mark.parametrize("method", [None, "lm", "trf", "dogbox"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_method_reaches_the_same_fit(kind: str, method: str | None) -> None:
    popt, _ = curve_fit(decay(kind), X, Y, [1.0, 1.0, 0.0], method=method)
    np.testing.assert_allclose(popt, reference(p0=[1, 1, 0])[0], rtol=POPT_RTOL[kind])


@pytest.mark.parametrize("jac", ["2-point", "3-point", "cs", "callable"])
@pytest.mark.parametrize("kind", KINDS)
def test_jac_schemes_and_callable(kind: str, jac: Any) -> None:
    f = two_parameter_decay(kind)
    x = np.linspace(0, 1, 11)
    y = two_parameter_decay("numpy")(x, 2.0, 2.0)

    def analytic(x: np.ndarray, a: float, b: float) -> np.ndarray:
        e = np.exp(-b * x)
        return np.stack([e, -a * x * e], axis=1)

    popt, _ = curve_fit(f, x, y, jac=analytic if jac == "callable" else jac)
    np.testing.assert_allclose(popt, [2.0, 2.0], rtol=1e-7)


@pytest.mark.parametrize("scheme", ["2-point", "3-point", "cs"])
def test_a_named_scheme_differences_a_torch_model_on_tensors_as_scipy_does(scheme: str) -> None:
    seen: set[torch.dtype] = set()

    def f(x: Any, a: Any, b: Any, c: Any) -> Any:
        seen.add(a.dtype)
        return a * torch.exp(-b * x) + c

    tight = {"ftol": 1e-14, "xtol": 1e-14, "gtol": 1e-14}
    ours = curve_fit(f, X, Y, [1.0, 1.0, 0.0], jac=scheme, **tight)
    numpy_model = curve_fit(numpy_decay, X, Y, [1.0, 1.0, 0.0], jac=scheme, **tight)
    theirs = scipy_optimize.curve_fit(
        numpy_decay, X, Y, [1.0, 1.0, 0.0], jac=scheme, method="trf", **tight
    )
    assert all(isinstance(v, np.ndarray) for v in ours)
    if scheme == "cs":  # the complex step reaches f as complex tensors
        assert torch.complex128 in seen
    # The same steps and the same J at p̂ as a NumPy model: pcov is the scheme's, as SciPy's.
    # torch's and NumPy's exp may differ in the last bit (by CPU), which a difference
    # quotient raises by 1/h ≈ 1e8: p̂ agrees to the tolerances' reach, 1e-8, and pcov, from
    # the quotients at p̂, to 1e-6.
    np.testing.assert_allclose(ours[0], numpy_model[0], rtol=1e-8)
    np.testing.assert_allclose(ours[1], numpy_model[1], rtol=1e-6)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-8)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-6)


def test_gh4555_a_torch_models_covariance_is_positive_semidefinite() -> None:
    """SciPy's test_gh4555 with the model written with torch: J at p̂ has columns dependent
    to 10⁻¹³, so the exact covariance (entries near 10²⁰) cannot be held in float64."""

    def f(x: Any, a: Any, b: Any, c: Any, d: Any, e: Any) -> Any:
        return a * torch.log(x + 1 + b) + c * torch.log(x + 1 + d) + e

    rng = np.random.default_rng(408113519974467917)
    x = np.arange(100)
    y = np.linspace(2, 7, 100) + rng.random(100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _, cov = curve_fit(f, x, y, maxfev=100000)
    assert np.all(np.diag(cov) > 0)
    assert np.all(np.linalg.eigvalsh(cov) > -1e-2)
    np.testing.assert_allclose(cov, cov.T)


def test_columns_dependent_beyond_float64_covariance() -> None:
    from marquardt.solver._curve.scipy.covariance import columns_dependent

    x = np.linspace(0.0, 1.0, 20)
    assert not columns_dependent(np.stack([np.ones(20), x, 1e6 * x**2], axis=1))
    assert columns_dependent(np.stack([np.ones(20), x, x + 1e-9 * x**2], axis=1))
    assert columns_dependent(np.stack([np.ones(20), np.zeros(20)], axis=1))
    assert columns_dependent(np.ones((2, 3)))


def test_jac_callable_is_weighted_by_sigma() -> None:
    f = two_parameter_decay("numpy")
    x = np.linspace(0, 1, 11)
    y = f(x, 2.0, 2.0)
    y[5] = 100.0
    sigma = np.ones(11)
    sigma[5] = 200.0

    def analytic(x: np.ndarray, a: float, b: float) -> np.ndarray:
        e = np.exp(-b * x)
        return np.stack([e, -a * x * e], axis=1)

    ours = curve_fit(f, x, y, sigma=sigma, jac=analytic)[0]
    theirs = scipy_optimize.curve_fit(f, x, y, sigma=sigma, jac=analytic)[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize("keyword", ["maxfev", "max_nfev"])
@pytest.mark.parametrize("kind", KINDS)
def test_running_out_of_evaluations_raises_runtime_error(kind: str, keyword: str) -> None:
    with pytest.raises(RuntimeError, match="Optimal parameters not found"):
        curve_fit(decay(kind), X, Y, [10.0, 10.0, 10.0], **{keyword: 2})


@pytest.mark.parametrize("kind", KINDS)
def test_robust_loss_matches_scipy_trf(kind: str) -> None:
    y = Y.copy()
    y[::7] += 3.0
    ours = curve_fit(decay(kind), X, y, [1, 1, 0], loss="soft_l1", f_scale=0.2)[0]
    theirs = scipy_optimize.curve_fit(
        numpy_decay, X, y, [1, 1, 0], method="trf", loss="soft_l1", f_scale=0.2
    )[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_x_scale_and_diff_step_leave_the_fit(kind: str) -> None:
    ref = reference(p0=[1, 1, 0])[0]
    popt = curve_fit(decay(kind), X, Y, [1, 1, 0], x_scale=[1.0, 0.5, 0.1])[0]
    np.testing.assert_allclose(popt, ref, rtol=1e-5)  # ftol = 1e-8 leaves ~√ftol
    popt = curve_fit(decay(kind), X, Y, [1, 1, 0], diff_step=1e-6)[0]
    np.testing.assert_allclose(popt, ref, rtol=1e-5)
