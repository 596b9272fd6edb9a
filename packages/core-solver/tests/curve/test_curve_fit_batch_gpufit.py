"""curve_fit_batch as a Gpufit user meets it: p0 checked before work, degenerate spots
marked singular, fixed parameters, p0 projected into the bounds, float32 kept, an
iteration limit, and the Poisson maximum-likelihood estimator against SciPy's ``minimize``
of the same likelihood.

Elliptic 2-D Gaussian spots of 7 × 7 pixels (six parameters), a few fits each: seconds.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from marquardt.solver import CovarianceWarning, OptimizeWarning, curve_fit, curve_fit_batch

SIDE = 7
GRID = np.stack(
    [a.ravel() for a in np.meshgrid(np.arange(SIDE), np.arange(SIDE), indexing="xy")]
).astype(np.float64)
TIGHT = {"ftol": 1e-14, "xtol": 1e-14, "gtol": 1e-14}


def spot(
    xy: torch.Tensor, a: object, x0: object, y0: object, sx: object, sy: object, b: object
) -> torch.Tensor:
    u = (xy[0] - x0) / sx  # type: ignore[operator]
    v = (xy[1] - y0) / sy  # type: ignore[operator]
    return a * torch.exp(-0.5 * (u * u + v * v)) + b  # type: ignore[operator]


def spot4(xy: torch.Tensor, a: object, x0: object, y0: object, b: object) -> torch.Tensor:
    """``spot`` with the widths 1.3 and 1.1 written in."""
    return spot(xy, a, x0, y0, 1.3, 1.1, b)


def _spots(fits: int, seed: int = 0, counts: bool = True) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    true = np.c_[
        rng.uniform(50, 500, fits),
        3 + rng.uniform(-0.5, 0.5, (fits, 2)),
        rng.uniform(1.0, 1.6, (fits, 2)),
        np.full(fits, 10.0),
    ]
    f = spot(torch.from_numpy(GRID), *torch.from_numpy(true).T[:, :, None]).numpy()
    return true, rng.poisson(f).astype(np.float64) if counts else f


def _p0(fits: int) -> np.ndarray:
    return np.tile([100.0, 3.0, 3.0, 1.3, 1.3, 8.0], (fits, 1))


class _Counted:
    """``spot`` that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(
        self, xy: torch.Tensor, a: object, x0: object, y0: object, sx: object, sy: object, b: object
    ) -> torch.Tensor:
        self.calls += 1
        return spot(xy, a, x0, y0, sx, sy, b)


@pytest.mark.parametrize(
    ("p0", "match"),
    [
        (np.ones((20, 5)), r"shape \(20, 5\): f takes 6 parameters .* 20 fits"),
        (np.ones((20, 7)), r"shape \(20, 7\): f takes 6 parameters"),
        (np.ones((6, 20)), r"looks transposed: pass p0.T, shape \(20, 6\)"),
        (np.ones(5), r"shape \(5,\): f takes 6 parameters"),
        (np.ones((3, 6)), r"shape \(3, 6\) for 20 fits"),
    ],
)
def test_p0_of_the_wrong_shape_is_refused_before_work(p0: np.ndarray, match: str) -> None:
    f = _Counted()
    _, y = _spots(20)
    with pytest.raises(ValueError, match=match) as caught:
        curve_fit_batch(f, GRID, y, p0)
    assert "HINT:" in str(caught.value) and f.calls == 0


def test_a_non_finite_p0_names_its_fits() -> None:
    f = _Counted()
    _, y = _spots(20)
    p0 = _p0(20)
    p0[3, 1], p0[11, 5] = np.nan, np.inf
    with pytest.raises(ValueError, match=r"2 of 20 fits \(3, 11\)"):
        curve_fit_batch(f, GRID, y, p0)
    assert f.calls == 0


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"bounds": ([0, 0, 0, 0.3, 0.3, 0], np.inf)},
        {"estimator": "poisson"},
        {"dtype": torch.float32},
    ],
)
def test_an_all_zero_spot_is_singular_with_inf_variances(kw: dict[str, object]) -> None:
    _, y = _spots(4)
    y[2] = 0.0
    with pytest.warns(CovarianceWarning, match="1 of 4 fits"):
        _, pcov, info = curve_fit_batch(spot, GRID, y, _p0(4), full_output=True, **kw)
    status, variances = info["status"], np.diagonal(pcov, axis1=1, axis2=2)
    assert status[2] == -1 and set(status[[0, 1, 3]].tolist()) <= {1, 2, 3, 4}
    # No light: the amplitude is 0 and the position and widths are undetermined.
    assert np.isinf(variances[2, 1:5]).all()
    assert np.isfinite(pcov[[0, 1, 3]]).all() and (variances[[0, 1, 3]] > 0).all()
    assert "zero column" in info["messages"][-1]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_small_but_determined_columns_are_not_singular(dtype: type) -> None:
    """A quadratic in x up to 200: the constant's column is about 6e-5 of x²'s, not zero
    (√ε of float32 would call it zero)."""
    x = np.linspace(0, 200, 40)
    rng = np.random.default_rng(10)
    y = 1.0 + 0.5 * x + 0.01 * x**2 + rng.standard_normal((5, 40))
    quadratic = lambda x, a, b, c: a + b * x + c * x * x  # noqa: E731
    _, pcov, info = curve_fit_batch(
        quadratic, x.astype(dtype), y.astype(dtype), [0.0, 0.0, 0.0], full_output=True
    )
    assert (info["status"] > 0).all() and np.isfinite(pcov).all()


def test_widths_fixed_equal_a_four_parameter_model() -> None:
    _, y = _spots(16, seed=1)
    p0 = _p0(16)
    p0[:, 3:5] = [1.3, 1.1]
    fixed = np.array([False, False, False, True, True, False])
    popt, pcov = curve_fit_batch(spot, GRID, y, p0, fixed=fixed, **TIGHT)
    four, cov4 = curve_fit_batch(spot4, GRID, y, p0[:, [0, 1, 2, 5]], **TIGHT)
    np.testing.assert_allclose(popt[:, [0, 1, 2, 5]], four, rtol=1e-8)
    np.testing.assert_array_equal(popt[:, 3:5], p0[:, 3:5])
    keep = np.ix_(range(16), [0, 1, 2, 5], [0, 1, 2, 5])
    np.testing.assert_allclose(pcov[keep], cov4, rtol=1e-6)
    assert (pcov[:, 3:5, :] == 0).all() and (pcov[:, :, 3:5] == 0).all()


def test_fixed_per_fit_and_its_refusals() -> None:
    _, y = _spots(3, seed=2)
    fixed = np.zeros((3, 6), dtype=bool)
    fixed[1, 5] = True
    p0 = _p0(3)
    popt, _ = curve_fit_batch(spot, GRID, y, p0, fixed=fixed)
    assert popt[1, 5] == p0[1, 5] and popt[0, 5] != p0[0, 5]
    with pytest.raises(ValueError, match="`fixed` is int64"):
        curve_fit_batch(spot, GRID, y, p0, fixed=np.zeros(6, dtype=np.int64))
    with pytest.raises(ValueError, match="holds every parameter of 3 fits"):
        curve_fit_batch(spot, GRID, y, p0, fixed=np.ones(6, dtype=bool))


def test_p0_outside_the_bounds_is_projected_with_one_warning() -> None:
    _, y = _spots(4, seed=3)
    bounds = ([0, 0, 0, 0.5, 0.5, 0], [1e4, 6, 6, 3, 3, 100])
    p0 = _p0(4)
    p0[1, 3], p0[3, 5] = 0.1, -5.0
    with pytest.warns(OptimizeWarning, match=r"p0 of 2 of 4 fits .* \(fits 1, 3\)") as caught:
        popt, _ = curve_fit_batch(spot, GRID, y, p0, bounds=bounds)
    assert len([w for w in caught if "projected" in str(w.message)]) == 1
    inside, _ = curve_fit_batch(spot, GRID, y, np.clip(p0, *bounds), bounds=bounds)
    np.testing.assert_array_equal(popt, inside)


def test_float32_in_float32_out() -> None:
    _, y = _spots(4, seed=4)
    p32, c32 = curve_fit_batch(spot, GRID.astype(np.float32), y.astype(np.float32), _p0(4))
    assert p32.dtype == np.float32 and c32.dtype == np.float32
    p64, _ = curve_fit_batch(spot, GRID, y, _p0(4))
    assert p64.dtype == np.float64
    np.testing.assert_allclose(p32, p64, rtol=1e-3)
    asked, _ = curve_fit_batch(spot, GRID, y, _p0(4), dtype=torch.float32)
    assert asked.dtype == np.float32
    tensor, _ = curve_fit_batch(
        spot, torch.from_numpy(GRID).float(), torch.from_numpy(y).float(), _p0(4)
    )
    assert tensor.dtype == torch.float32


def test_max_iterations_counts_trial_steps() -> None:
    _, y = _spots(4, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        popt, _, info = curve_fit_batch(spot, GRID, y, _p0(4), max_iterations=3, full_output=True)
        same, _, _ = curve_fit_batch(spot, GRID, y, _p0(4), max_nfev=4, full_output=True)
    assert (info["steps"] <= 3).all() and (info["status"] == 0).any()
    np.testing.assert_array_equal(popt, same)
    with pytest.raises(ValueError, match="max_iterations"):
        curve_fit_batch(spot, GRID, y, _p0(4), max_iterations=-1)


def _deviance(p: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """½ of the Poisson deviance of one spot and its gradient (by autodiff)."""
    t = torch.tensor(p, requires_grad=True)
    f = spot(torch.from_numpy(GRID), *t)
    yt = torch.from_numpy(y)
    logs = torch.where(yt > 0, yt * torch.log(f / torch.where(yt > 0, yt, 1.0)), 0.0)
    c = (f - yt - logs).sum()
    c.backward()
    return float(c.detach()), t.grad.numpy()  # type: ignore[union-attr]


def test_poisson_equals_scipy_minimize_of_the_same_likelihood() -> None:
    _, y = _spots(6, seed=6)
    popt, pcov, info = curve_fit_batch(
        spot, GRID, y, _p0(6), estimator="poisson", full_output=True, **TIGHT
    )
    assert set(info["status"].tolist()) <= {1, 2, 3, 4}
    xy = torch.from_numpy(GRID)
    for m in range(6):
        ref = minimize(
            _deviance, _p0(1)[0], args=(y[m],), jac=True, method="BFGS", options={"gtol": 1e-9}
        )
        np.testing.assert_allclose(popt[m], ref.x, rtol=1e-5, err_msg=f"fit {m}")
        np.testing.assert_allclose(info["chi_square"][m], 2 * ref.fun, rtol=1e-9)
        jac = torch.func.jacfwd(lambda q: spot(xy, *q))(torch.from_numpy(popt[m])).numpy()
        f = spot(xy, *torch.from_numpy(popt[m])).numpy()
        fisher = (jac / f[:, None]).T @ jac
        np.testing.assert_allclose(pcov[m], np.linalg.inv(fisher), rtol=1e-6)


def test_poisson_pcov_takes_the_information_of_the_last_accepted_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each fit's Fisher information is formed once: from the accepted trial it stopped on,
    or at the end for a fit that stopped otherwise; pcov is its inverse either way."""
    from marquardt.solver._curve.batched_lm import estimators

    sizes: list[int] = []
    formed = estimators.information

    def counted(j: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        sizes.append(j.shape[0])
        return formed(j, f)

    monkeypatch.setattr(estimators, "information", counted)
    _, y = _spots(40, seed=9)
    popt, pcov = curve_fit_batch(spot, GRID, y, _p0(40), estimator="poisson")
    assert sum(sizes) == 40 and len(sizes) >= 2
    xy = torch.from_numpy(GRID)
    for m in range(40):
        jac = torch.func.jacfwd(lambda q: spot(xy, *q))(torch.from_numpy(popt[m])).numpy()
        f = spot(xy, *torch.from_numpy(popt[m])).numpy()
        inverse = np.linalg.inv((jac / f[:, None]).T @ jac)
        np.testing.assert_allclose(pcov[m], inverse, rtol=1e-6, atol=1e-9, err_msg=f"fit {m}")


def test_poisson_marks_a_model_non_positive_at_counts_and_refuses_sigma() -> None:
    _, y = _spots(3, seed=7)
    p0 = _p0(3)
    p0[1, 5] = -200.0  # the background makes f negative at every pixel
    with pytest.warns(OptimizeWarning, match="Non-positive model"):
        popt, _, info = curve_fit_batch(spot, GRID, y, p0, estimator="poisson", full_output=True)
    assert info["status"][1] == -4 and set(info["status"][[0, 2]].tolist()) <= {1, 2, 3, 4}
    np.testing.assert_array_equal(popt[1], p0[1])
    with pytest.raises(ValueError, match="neither sigma"):
        curve_fit_batch(spot, GRID, y, p0, sigma=np.ones(49), estimator="poisson")
    with pytest.raises(ValueError, match="estimator must be one of"):
        curve_fit_batch(spot, GRID, y, p0, estimator="mle")


def test_curve_fit_fixed_equals_the_model_with_the_values_written_in() -> None:
    _, y = _spots(1, seed=8)
    p0 = np.array([100.0, 3.0, 3.0, 1.3, 1.1, 8.0])
    fixed = np.array([False, False, False, True, True, False])
    popt, pcov = curve_fit(spot, GRID, y[0], p0, fixed=fixed)
    four, cov4 = curve_fit(spot4, GRID, y[0], p0[[0, 1, 2, 5]])
    np.testing.assert_array_equal(popt[[0, 1, 2, 5]], four)
    np.testing.assert_array_equal(popt[3:5], p0[3:5])
    np.testing.assert_array_equal(pcov[np.ix_([0, 1, 2, 5], [0, 1, 2, 5])], cov4)
    assert (pcov[3:5] == 0).all() and (pcov[:, 3:5] == 0).all()
    with pytest.raises(ValueError, match="outside of provided bounds"):
        curve_fit(spot, GRID, y[0], p0, bounds=(0, 2), fixed=fixed)


def test_curve_fit_poisson_equals_the_batch() -> None:
    _, y = _spots(1, seed=9)
    p0 = _p0(1)[0]
    popt, pcov, info, _, ier = curve_fit(
        spot, GRID, y[0], p0, estimator="poisson", full_output=True
    )
    batch, cov, _ = curve_fit_batch(spot, GRID, y, p0, estimator="poisson", full_output=True)
    np.testing.assert_array_equal(popt, batch[0])
    np.testing.assert_array_equal(pcov, cov[0])
    assert 1 <= ier <= 4 and info["chi_square"] > 0
    with pytest.raises(RuntimeError, match="Optimal parameters not found"):
        curve_fit(spot, GRID, y[0], p0, estimator="poisson", max_nfev=2)


def test_widths_fixed_per_fit_equal_curve_fit_on_each() -> None:
    """Fixed values differing per fit (the mask shared, then per fit) keep the parameters in
    the problem with zero columns; each fit ends where curve_fit with ``fixed`` ends."""
    true, y = _spots(3, seed=11)
    p0 = _p0(3)
    p0[:, 3:5] = true[:, 3:5]
    fixed = np.array([False, False, False, True, True, False])
    shared, _ = curve_fit_batch(spot, GRID, y, p0, fixed=fixed, **TIGHT)
    per_fit, _ = curve_fit_batch(spot, GRID, y, p0, fixed=np.tile(fixed, (3, 1)), **TIGHT)
    np.testing.assert_allclose(shared, per_fit, rtol=1e-10)
    for m in range(3):
        alone, _ = curve_fit(spot, GRID, y[m], p0[m], fixed=fixed, **TIGHT)
        np.testing.assert_allclose(shared[m], alone, rtol=1e-7, err_msg=f"fit {m}")
