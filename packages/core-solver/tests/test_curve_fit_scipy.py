"""curve_fit behaves as scipy.optimize.curve_fit (SciPy 1.17's documentation), for models
written with NumPy and with torch: its keywords and input forms, returns, exceptions and
warnings, each checked against SciPy itself where SciPy gives a number."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from marquardt.solver import CovarianceWarning, OptimizeWarning, curve_fit

scipy_optimize = pytest.importorskip("scipy.optimize")

KINDS = ("numpy", "torch")


def _exp(kind: str) -> Callable[[Any], Any]:
    return np.exp if kind == "numpy" else torch.exp


def decay(kind: str) -> Callable[..., Any]:
    e = _exp(kind)

    def f(x: Any, a: Any, b: Any, c: Any) -> Any:
        return a * e(-b * x) + c

    return f


def two_parameter_decay(kind: str) -> Callable[..., Any]:
    e = _exp(kind)

    def f(x: Any, a: Any, b: Any) -> Any:
        return a * e(-b * x)

    return f


def _numpy_decay(x: Any, a: Any, b: Any, c: Any) -> Any:
    return a * np.exp(-b * x) + c


RNG = np.random.default_rng(7)
X = np.linspace(0.0, 4.0, 50)
Y = _numpy_decay(X, 2.5, 1.3, 0.5) + 0.2 * RNG.standard_normal(50)
SIGMA = 0.1 + 0.05 * RNG.random(50)


def _reference(**kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        popt, pcov = scipy_optimize.curve_fit(_numpy_decay, X, Y, **kwargs)
    return popt, pcov


def _exact_pcov(
    p: np.ndarray, sigma: np.ndarray | None = None, absolute: bool = False
) -> np.ndarray:
    """s²(JᵀJ)⁻¹ from the analytic J of the decay at p (whitened by 1/σ)."""
    a, b, _ = p
    e = np.exp(-b * X)
    w = np.ones(50) if sigma is None else 1.0 / sigma
    j = np.stack([e, -a * X * e, np.ones(50)], axis=1) * w[:, None]
    r = (_numpy_decay(X, *p) - Y) * w
    scale = 1.0 if absolute else float(r @ r) / 47
    return np.linalg.inv(j.T @ j) * scale


@pytest.mark.parametrize("kind", KINDS)
def test_popt_matches_scipy_and_pcov_is_the_exact_covariance(kind: str) -> None:
    popt, pcov = curve_fit(decay(kind), X, Y, p0=[1.0, 1.0, 0.0])
    ref_popt, ref_pcov = _reference(p0=[1.0, 1.0, 0.0])
    np.testing.assert_allclose(popt, ref_popt, rtol=1e-6)
    # SciPy's "lm" pcov comes from the last J MINPACK formed, one step before p̂ (here
    # 1e-4 from the exact covariance); ours from J at p̂.
    np.testing.assert_allclose(pcov, _exact_pcov(popt), rtol=1e-6)
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
    np.testing.assert_allclose(popt.numpy(), _reference(p0=[1, 1, 0])[0], rtol=1e-6)


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
    ref = _reference(p0=[1.0, 1.0, 0.0], sigma=SIGMA, absolute_sigma=True)
    np.testing.assert_allclose(popt, ref[0], rtol=1e-6)
    np.testing.assert_allclose(pcov, _exact_pcov(popt, SIGMA, absolute=True), rtol=1e-6)


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
    ref = _reference(p0=[1.0, 1.0, 0.0], sigma=cov)
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
    ref = _reference(bounds=bounds)[0]
    np.testing.assert_allclose(popt, ref, rtol=1e-5, atol=1e-8)
    assert popt[1] == pytest.approx(1.0)


@pytest.mark.parametrize("kind", KINDS)
def test_bounds_object_equals_the_pair(kind: str) -> None:
    pair = curve_fit(decay(kind), X, Y, bounds=([0, 0, 0], [3, 1, 0.5]))[0]
    obj = curve_fit(decay(kind), X, Y, bounds=scipy_optimize.Bounds([0, 0, 0], [3, 1, 0.5]))[0]
    np.testing.assert_allclose(pair, obj, rtol=1e-12)


@pytest.mark.parametrize("method", [None, "lm", "trf", "dogbox"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_method_reaches_the_same_fit(kind: str, method: str | None) -> None:
    popt, _ = curve_fit(decay(kind), X, Y, [1.0, 1.0, 0.0], method=method)
    np.testing.assert_allclose(popt, _reference(p0=[1, 1, 0])[0], rtol=1e-6)


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
    numpy_model = curve_fit(_numpy_decay, X, Y, [1.0, 1.0, 0.0], jac=scheme, **tight)
    theirs = scipy_optimize.curve_fit(
        _numpy_decay, X, Y, [1.0, 1.0, 0.0], jac=scheme, method="trf", **tight
    )
    assert all(isinstance(v, np.ndarray) for v in ours)
    if scheme == "cs":  # the complex step reaches f as complex tensors
        assert torch.complex128 in seen
    # The same steps and the same J at p̂ as a NumPy model: pcov is the scheme's, as SciPy's.
    np.testing.assert_allclose(ours[0], numpy_model[0], rtol=1e-9)
    np.testing.assert_allclose(ours[1], numpy_model[1], rtol=1e-7)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-8)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-7)


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
        _numpy_decay, X, y, [1, 1, 0], method="trf", loss="soft_l1", f_scale=0.2
    )[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_x_scale_and_diff_step_leave_the_fit(kind: str) -> None:
    ref = _reference(p0=[1, 1, 0])[0]
    popt = curve_fit(decay(kind), X, Y, [1, 1, 0], x_scale=[1.0, 0.5, 0.1])[0]
    np.testing.assert_allclose(popt, ref, rtol=1e-5)  # ftol = 1e-8 leaves ~√ftol
    popt = curve_fit(decay(kind), X, Y, [1, 1, 0], diff_step=1e-6)[0]
    np.testing.assert_allclose(popt, ref, rtol=1e-5)


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
    y = _numpy_decay(x, 2.5, 1.3, 0.5) + 0.01 * np.random.default_rng(3).standard_normal(x.size)
    xs, ys = (torch.from_numpy(x), torch.from_numpy(y)) if torch_data else (x, y)
    popt, pcov, info, mesg, ier = curve_fit(decay("torch"), xs, ys, [1, 1, 0], full_output=True)
    assert isinstance(popt, torch.Tensor) == torch_data
    assert isinstance(pcov, torch.Tensor) == torch_data
    theirs = scipy_optimize.curve_fit(_numpy_decay, x, y, [1, 1, 0])[0]
    np.testing.assert_allclose(np.asarray(popt), theirs, rtol=1e-6)
    assert info["fvec"].shape == (60_000,) and isinstance(mesg, str) and ier == 1
