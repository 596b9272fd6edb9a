"""curve_fit as scipy.optimize.curve_fit: the input forms it accepts (nan_policy, xdata of
any shape, bound methods, broadcast ydata, leastsq's keywords, large torch fits) and those
it refuses before any work, each against SciPy itself where SciPy gives a number."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from scipy_cases import KINDS, RNG, SIGMA, X, Y, decay, numpy_decay, two_parameter_decay

from marquardt.solver import OptimizeWarning, curve_fit

scipy_optimize = pytest.importorskip("scipy.optimize")


@pytest.mark.parametrize("kind", KINDS)
def test_nan_policy_omit_drops_points_and_their_sigma(kind: str) -> None:
    x, y, sigma = X.copy(), Y.copy(), SIGMA.copy()
    x[3], y[10] = np.nan, np.nan
    omitted = curve_fit(
        decay(kind), x, y, [1, 1, 0], sigma=sigma, check_finite=False, nan_policy="omit"
    )
    keep = np.ones(50, bool)
    keep[[3, 10]] = False
    clean = curve_fit(decay(kind), X[keep], Y[keep], [1, 1, 0], sigma=SIGMA[keep])
    np.testing.assert_allclose(omitted[0], clean[0], rtol=1e-12)
    np.testing.assert_allclose(omitted[1], clean[1], rtol=1e-12)


def test_nan_policy_omit_drops_rows_and_columns_of_a_covariance_sigma() -> None:
    x, y = X.copy(), Y.copy()
    y[4] = np.nan
    cov = np.diag(SIGMA**2)
    omitted = curve_fit(decay("numpy"), x, y, [1, 1, 0], sigma=cov, nan_policy="omit")
    keep = np.arange(50) != 4
    clean = curve_fit(decay("numpy"), X[keep], Y[keep], [1, 1, 0], sigma=SIGMA[keep])
    np.testing.assert_allclose(omitted[0], clean[0], rtol=1e-7)


def test_nan_policy_raise_propagate_and_unknown() -> None:
    y = Y.copy()
    y[2] = np.nan
    f = decay("numpy")
    with pytest.raises(ValueError, match="contains nan"):
        curve_fit(f, X, y, nan_policy="raise")
    with pytest.raises(ValueError, match="propagate"):
        curve_fit(f, X, y, nan_policy="propagate")
    with pytest.raises(ValueError, match="nan_policy must be one of"):
        curve_fit(f, X, y, check_finite=False, nan_policy="drop")
    with pytest.raises(ValueError, match="infs or NaNs"):
        curve_fit(f, X, y)


@pytest.mark.parametrize("kind", KINDS)
def test_xdata_of_any_shape_is_passed_untouched(kind: str) -> None:
    grid = np.stack([X, X**2])

    def plane(x: Any, a: Any, b: Any) -> Any:
        return a * x[0] + b * x[1]

    popt, _ = curve_fit(plane, grid, plane(grid, 1.5, -0.25))
    np.testing.assert_allclose(popt, [1.5, -0.25], rtol=1e-9)
    seen: list[object] = []
    arange = np.arange if kind == "numpy" else torch.arange

    def ignores_x(x: Any, a: Any) -> Any:
        seen.append(x)
        return a * arange(10)

    popt, _ = curve_fit(ignores_x, None, 2.0 * np.arange(10))
    assert popt[0] == pytest.approx(2.0) and all(x is None for x in seen)


def test_f_as_a_bound_method_counts_its_parameters() -> None:
    class Model:
        def f(self, x: np.ndarray, a: float, b: float) -> np.ndarray:
            return b * x**a

    popt, _ = curve_fit(Model().f, [1.0, 2.0, 3.0, 4.0], [1.0, 3.2, 9.5, 13.7])
    np.testing.assert_allclose(popt, [1.7989, 1.1642], atol=1e-4)


def test_a_parameter_turned_into_a_python_float_is_an_error() -> None:
    y = 2.0 * np.exp(-math.e * X)

    def f(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * torch.exp(-math.exp(b) * x)

    with pytest.raises(ValueError, match=r"parameter\(s\) \[1\].*HINT"):
        curve_fit(f, X, y, [1.0, 0.0])


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_that_mixes_points_is_fitted_whole(kind: str) -> None:
    def f(x: Any, a: Any, b: Any) -> Any:
        return a * x / x.max() + b

    y = 2.0 * X / X.max() + 1.0 + 0.01 * RNG.standard_normal(50)
    ours = curve_fit(f, X, y)
    theirs = scipy_optimize.curve_fit(f, X, y)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-7)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5)


def test_a_model_that_mixes_points_warns_on_the_sliced_engine() -> None:
    def f(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * x / x.max() + b

    y = 2.0 * X / X.max() + 1.0
    with pytest.warns(OptimizeWarning, match="mixes data points.*HINT"):
        curve_fit(f, torch.from_numpy(X), torch.from_numpy(y), device="cpu")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"p0": None, "f": lambda x, *p: x}, ValueError, "number of fit parameters"),
        ({"p0": None, "f": lambda x: x}, ValueError, "number of fit parameters"),
        ({"method": "newton"}, ValueError, "`method` must be"),
        ({"method": "lm", "bounds": (0, 10)}, ValueError, "only works for unconstrained"),
        ({"jac": "4-point"}, ValueError, "`jac` must be"),
        ({"bounds": (1, 0)}, ValueError, "strictly less"),
        ({"bounds": ([0, 0], [1, 1])}, ValueError, "Inconsistent shapes"),
        ({"bounds": (5, 6)}, ValueError, "outside of provided bounds"),
        ({"sigma": np.ones(7)}, ValueError, "incorrect shape"),
        ({"sigma": -np.ones(50)}, ValueError, "positive"),
        ({"sigma": -np.eye(50)}, ValueError, "positive definite"),
        ({"maxfev": 0}, ValueError, "max_nfev"),
        ({"ftol": -1.0}, ValueError, "ftol"),
        ({"loss": "l7"}, ValueError, "loss"),
        ({"f_scale": 0.0}, ValueError, "f_scale"),
        ({"x_scale": [1.0, -1.0, 1.0]}, ValueError, "x_scale"),
        ({"args": (1,)}, ValueError, "'args' is not a supported"),
        ({"diff_step": -1e-6}, ValueError, "diff_step"),
        ({"epsfcn": "tiny"}, ValueError, "epsfcn"),
        ({"learning_rate": 1.0}, TypeError, "unexpected keyword"),
        ({"ydata": []}, ValueError, "must not be empty"),
    ],
)
def test_bad_input_is_refused_before_any_work_with_a_hint(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    calls: list[int] = []

    def f(x: Any, a: Any, b: Any, c: Any) -> Any:
        calls.append(1)
        return a * np.exp(-b * x) + c

    args: dict[str, Any] = {"f": f, "xdata": X, "ydata": Y, "p0": [1.0, 1.0, 0.0]}
    args.update(kwargs)
    if args["p0"] is None:
        args.pop("p0")
    with pytest.raises(error, match=match) as info:
        curve_fit(**args)
    assert "HINT:" in str(info.value)
    assert not calls


def test_more_parameters_than_points_is_a_type_error_for_lm() -> None:
    def f(x: np.ndarray, a: float, b: float, c: float, d: float, e: float) -> np.ndarray:
        return a * np.exp(-b * x) + c + d + e

    with pytest.raises(TypeError, match=r"The number of func parameters=5.*HINT"):
        curve_fit(f, [1, 2, 3, 4], [5, 9, 13, 17])


def test_ydata_broadcast_from_a_scalar() -> None:
    x = np.arange(10.0)
    target = 4.7 * x**2 + 3.5 * x + RNG.random(10)

    def f(x: np.ndarray, a: float, b: float) -> np.ndarray:
        return a * x**2 + b * x - target

    _, zeros = curve_fit(f, x, np.zeros(10))
    _, scalar = curve_fit(f, x, 0)
    np.testing.assert_allclose(zeros, scalar, rtol=1e-10)


def test_leastsq_keywords_epsfcn_and_col_deriv() -> None:
    f = two_parameter_decay("numpy")
    x = np.linspace(0, 1, 11)
    y = f(x, 2.0, 2.0)

    def by_columns(x: np.ndarray, a: float, b: float) -> np.ndarray:
        e = np.exp(-b * x)
        return np.stack([e, -a * x * e])  # P × N, as leastsq's col_deriv=True has it

    np.testing.assert_allclose(curve_fit(f, x, y, epsfcn=1e-10)[0], [2.0, 2.0], rtol=1e-7)
    np.testing.assert_allclose(
        curve_fit(f, x, y, jac=by_columns, col_deriv=True)[0], [2.0, 2.0], rtol=1e-7
    )


def test_a_small_fit_leaves_torchs_thread_count_as_it_was() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[int] = []

        def f(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return a * torch.exp(-b * x)

        x = np.linspace(0, 1, 20_000)
        curve_fit(f, x, 2.0 * np.exp(-2.0 * x), [1.0, 1.0])
        assert set(seen) == {1}  # the fit itself runs on one thread
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("torch_data", [False, True])
def test_a_large_torch_fit_on_the_sliced_engine_keeps_scipys_forms(torch_data: bool) -> None:
    x = np.linspace(0.0, 4.0, 60_000)
    y = numpy_decay(x, 2.5, 1.3, 0.5) + 0.01 * np.random.default_rng(3).standard_normal(x.size)
    xs, ys = (torch.from_numpy(x), torch.from_numpy(y)) if torch_data else (x, y)
    popt, pcov, info, mesg, ier = curve_fit(decay("torch"), xs, ys, [1, 1, 0], full_output=True)
    assert isinstance(popt, torch.Tensor) == torch_data
    assert isinstance(pcov, torch.Tensor) == torch_data
    theirs = scipy_optimize.curve_fit(numpy_decay, x, y, [1, 1, 0])[0]
    np.testing.assert_allclose(np.asarray(popt), theirs, rtol=1e-6)
    assert info["fvec"].shape == (60_000,) and isinstance(mesg, str) and ier == 1
