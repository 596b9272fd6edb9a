"""``curve_fit(..., compile=...)`` with a torch model: the fit as a batch of one through
``curve_fit_batch``'s compiled core (``_curve.batch_of_one``) against the host path,
which path ``"auto"`` takes with and without a kept kernel, and what goes to the host path
whatever ``compile`` says. One tiny fit is compiled once for the module."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

import marquardt.solver._curve.curve_fit as curve_fit_module
from marquardt.solver import cache, curve_fit
from marquardt.solver._errors import CompileWarning

X = np.linspace(0.0, 3.0, 24)
Y = 1.7 * np.exp(-0.8 * X) + 0.3 + np.random.default_rng(5).normal(0, 0.01, X.size)
P0 = [1.0, 1.0, 0.0]
#: How near the core's p̂ is to the host path's (``test_the_core_gives_the_host_paths_fit``).
HOST_RTOL = 1e-7


def decay(t: torch.Tensor, a: Any, k: Any, c: Any) -> torch.Tensor:
    return a * torch.exp(-k * t) + c


def rise(t: torch.Tensor, a: Any, k: Any, c: Any) -> torch.Tensor:
    return c - a * torch.exp(-k * t)


def _kept() -> int:
    return len(cache.entries())


@pytest.fixture(scope="module")
def fits() -> dict[str, Any]:
    host = curve_fit(decay, X, Y, P0, compile=False, full_output=True)
    before = _kept()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        core = curve_fit(decay, X, Y, P0, compile=True, full_output=True)
    return {"host": host, "core": core, "new_kernels": _kept() - before}


def _host_path_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fit took the host path")

    monkeypatch.setattr(curve_fit_module, "small_fit", refused)


def test_the_core_gives_the_host_paths_fit(fits: dict[str, Any]) -> None:
    host, core = fits["host"], fits["core"]
    assert fits["new_kernels"] >= 1  # the iteration, kept on disk
    # The host's "lm" (MINPACK's trust region, then autodiff's J) ends 1e-10 from the
    # optimum, the core's damped steps 1e-8: the same fit to the tolerances' reach.
    np.testing.assert_allclose(core[0], host[0], rtol=HOST_RTOL)
    np.testing.assert_allclose(core[1], host[1], rtol=1e-6)
    assert core[4] == host[4] and core[3] == host[3]
    assert set(core[2]) == set(host[2])  # nfev, njev, fvec and leastsq's factor
    np.testing.assert_allclose(core[2]["fvec"], host[2]["fvec"], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.abs(core[2]["qtf"]), np.abs(host[2]["qtf"]), atol=1e-8)


def test_auto_uses_the_kept_kernel(fits: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    _host_path_refused(monkeypatch)
    popt, pcov = curve_fit(decay, X, Y, P0)
    np.testing.assert_allclose(popt, fits["host"][0], rtol=HOST_RTOL)
    np.testing.assert_allclose(pcov, fits["host"][1], rtol=1e-6)
    tensors = curve_fit(decay, torch.from_numpy(X), torch.from_numpy(Y), P0)
    assert isinstance(tensors[0], torch.Tensor)
    np.testing.assert_allclose(tensors[0].numpy(), popt, rtol=1e-12)


def test_auto_without_a_kernel_takes_the_host_path_and_compiles_nothing(
    fits: dict[str, Any],
) -> None:
    before = _kept()
    popt, _ = curve_fit(rise, X, 2.0 - Y, P0)
    assert _kept() == before
    want = curve_fit(rise, X, 2.0 - Y, P0, compile=False)[0]
    np.testing.assert_array_equal(popt, want)


@pytest.fixture
def host_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The host path's calls, counted (it still runs)."""
    called: list[bool] = []
    host = curve_fit_module.small_fit

    def counted(*args: Any, **kwargs: Any) -> Any:
        called.append(True)
        return host(*args, **kwargs)

    monkeypatch.setattr(curve_fit_module, "small_fit", counted)
    return called


@pytest.mark.parametrize(
    "keywords",
    [{"jac": "3-point"}, {"diff_step": 1e-6}, {"x_scale": [1.0, 1.0, 1.0]}],
    ids=["jac", "diff_step", "x_scale"],
)
def test_what_the_core_does_not_serve_takes_the_host_path(
    fits: dict[str, Any], keywords: dict[str, Any], host_calls: list[bool]
) -> None:
    popt, _ = curve_fit(decay, X, Y, P0, compile=True, **keywords)
    assert host_calls
    np.testing.assert_allclose(popt, fits["host"][0], rtol=1e-6)


def test_a_covariance_matrix_as_sigma_takes_the_host_path(host_calls: list[bool]) -> None:
    curve_fit(decay, X, Y, P0, sigma=np.eye(X.size) * 0.01, compile=True)
    assert host_calls


def test_the_compile_keyword_is_checked_before_any_work() -> None:
    with pytest.raises(ValueError, match="compile must be"):
        curve_fit(decay, X, Y, P0, compile="yes")
