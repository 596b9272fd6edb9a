"""Defects a user meets by trying: fits left without enough points, torch's own warnings
under warnings-as-errors, warnings that name the user's line, NumPy models given to
`curve_fit_result`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from marquardt.solver import (
    CovarianceWarning,
    CurveFitInputError,
    OptimizeWarning,
    curve_fit,
    curve_fit_batch,
    curve_fit_result,
)

X = np.linspace(0.0, 4.0, 30)
Y = 2.5 * np.exp(-1.3 * X) + 0.5


def decay(x: Any, a: Any, b: Any, c: Any) -> Any:
    return a * torch.exp(-b * x) + c


def numpy_decay(x: Any, a: Any, b: Any, c: Any) -> Any:
    return a * np.exp(-b * x) + c


def test_a_fit_omitted_down_to_fewer_points_than_parameters_fails_with_its_own_status() -> None:
    y = np.stack([Y, Y, Y])
    y[1] = np.nan  # every point of fit 1
    y[2, 2:] = np.nan  # two points left for three parameters
    with pytest.warns(OptimizeWarning, match="Too few points"):
        popt, pcov, info = curve_fit_batch(
            decay, X, y, [1.0, 1.0, 0.0], nan_policy="omit", full_output=True
        )
    status = info["status"]
    assert status[0] > 0 and status[1] <= 0 and status[2] <= 0
    assert status[1] == status[2] and status[1] not in (0, -1, -2)  # its own code
    assert "fewer points than parameters" in info["messages"][int(status[1])]
    assert np.isnan(popt[1:]).all() and np.isinf(pcov[1:]).all()
    np.testing.assert_allclose(popt[0], [2.5, 1.3, 0.5], rtol=1e-6)


def test_torch_own_deprecation_warnings_neither_fail_nor_are_blamed_on_f(tmp_path: Any) -> None:
    """Under ``-W error``, in a fresh process (``torch.func.jacfwd``'s first use there)."""
    script = tmp_path / "fit.py"
    script.write_text(
        textwrap.dedent(
            """
            import warnings
            import torch
            from marquardt.solver import curve_fit_batch

            warnings.simplefilter("error")
            x = torch.linspace(0, 1, 20, dtype=torch.float64)
            y = torch.stack([2 * torch.exp(-1.5 * x), 3 * torch.exp(-0.5 * x)])
            popt, _ = curve_fit_batch(lambda x, a, b: a * torch.exp(-b * x), x, y, [1.0, 1.0])
            assert torch.allclose(popt, torch.tensor([[2.0, 1.5], [3.0, 0.5]], dtype=popt.dtype))

            def warns(x, a, b):  # the user's own warning is still the user's
                warnings.warn("from f", DeprecationWarning)
                return a * torch.exp(-b * x)

            try:
                curve_fit_batch(warns, x, y, [1.0, 1.0])
            except ValueError as err:
                assert "from f" in str(err), err
            else:
                raise AssertionError("the model's own warning was swallowed")
            print("ok")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def _recorded(call: Any) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, OptimizeWarning)]


def test_optimize_and_covariance_warnings_name_the_callers_line() -> None:
    y = np.stack([Y, Y])
    cases = [  # each call below is on its own line, which the warning must name
        lambda: curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0], max_nfev=2),
        lambda: curve_fit(lambda x, a, b: a * np.exp(-0 * b * x), X, Y, [1.0, 1.0]),
        lambda: curve_fit(lambda x, a, b: a * torch.exp(-0 * b * x), X, Y, [1.0, 1.0]),
        lambda: curve_fit_batch(decay, X[:3], y[:, :3], [1.0, 1.0, 0.0]),  # N = P: s² undefined
    ]
    kinds = []
    for case in cases:
        caught = _recorded(case)
        assert caught, case
        for w in caught:
            assert w.filename == __file__, (w.filename, w.lineno, str(w.message))
            kinds.append(w.category)
    assert OptimizeWarning in kinds and CovarianceWarning in kinds


def test_the_engines_covariance_warning_names_the_callers_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import marquardt.solver._curve.curve_fit as scipy_face

    monkeypatch.setattr(scipy_face, "SMALL_POINTS", 10)
    caught = _recorded(
        lambda: curve_fit(lambda x, a, b: a * torch.exp(-0 * b * x), X, Y, [1.0, 1.0])
    )
    assert [w.category for w in caught] == [CovarianceWarning]
    assert caught[0].filename == __file__


def test_curve_fit_result_refuses_a_numpy_model_before_any_work_with_a_hint() -> None:
    calls = []

    def f(x: Any, a: Any, b: Any, c: Any) -> Any:
        calls.append(1)
        return a * np.exp(-b * x) + c

    with pytest.raises(CurveFitInputError, match="HINT: fit a NumPy model with curve_fit"):
        curve_fit_result(f, X, Y, [1.0, 1.0, 0.0])
    assert len(calls) <= 2  # the probe's calls only
    popt, _ = curve_fit(f, X, Y, [1.0, 1.0, 0.0])  # which curve_fit fits
    np.testing.assert_allclose(popt, [2.5, 1.3, 0.5], rtol=1e-6)


@pytest.mark.parametrize("given", ["numpy", "list", "torch64", "torch32"])
def test_curve_fit_result_returns_float64_cpu_tensors_whatever_the_input(given: str) -> None:
    convert = {
        "numpy": lambda a: a,
        "list": lambda a: a.tolist(),
        "torch64": torch.from_numpy,
        "torch32": lambda a: torch.from_numpy(a).float(),
    }[given]
    res = curve_fit_result(decay, convert(X), convert(Y), [1.0, 1.0, 0.0])
    for t in (res.popt, res.pcov, res.perr, res.residuals, res.singular_values):
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.device.type == "cpu"
    assert isinstance(res.cost, float) and isinstance(res.steps, int)
    assert isinstance(res.jacobian_rank, int)
    np.testing.assert_allclose(res.popt.numpy(), [2.5, 1.3, 0.5], rtol=1e-4)
