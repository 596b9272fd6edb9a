"""Each SciPy keyword of ``curve_fit`` on every path: it changes what the fit does, or it
is refused with the exception class SciPy raises for it.

Paths: a NumPy model (small path), a torch model on the small path, a torch model on the
sliced engine (its threshold lowered to a few points, so that the data stay small), and
``curve_fit_batch`` where it has the keyword. Each row of ``CHANGES`` is a keyword and two
values whose fits must differ (in evaluations, parameters, covariance or what comes back);
each row of ``REFUSALS`` a value SciPy refuses, run through SciPy's own ``curve_fit`` first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.optimize as scipy_optimize
import torch

import marquardt.solver._curve.curve_fit as scipy_face
from marquardt.solver import OptimizeWarning, curve_fit, curve_fit_batch

RNG = np.random.default_rng(1)
X = np.linspace(0.0, 4.0, 40)
Y = 2.5 * np.exp(-1.3 * X) + 0.5 + 0.02 * RNG.standard_normal(X.size)
Y_OUTLIERS = Y.copy()
Y_OUTLIERS[::7] += 1.0
P0 = [1.0, 1.0, 0.0]
PATHS = ("numpy", "torch_small", "torch_engine", "batch")


def numpy_decay(x: Any, a: Any, b: Any, c: Any) -> Any:
    return a * np.exp(-b * x) + c


def torch_decay(x: Any, a: Any, b: Any, c: Any) -> Any:
    return a * torch.exp(-b * x) + c


def _fit(path: str, y: np.ndarray, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> dict[str, Any]:
    """One fit on ``path``: what a user sees (popt, pcov, evaluations, message)."""
    if path == "batch":
        popt, pcov, info = curve_fit_batch(
            torch_decay, X, np.stack([y, y]), P0, full_output=True, **kw
        )
        return {"popt": popt[0], "pcov": pcov[0], "nfev": int(info["nfev"][0]), "mesg": ""}
    if path == "torch_engine":
        monkeypatch.setattr(scipy_face, "SMALL_POINTS", 10)
    f = numpy_decay if path == "numpy" else torch_decay
    out = curve_fit(f, X, y, P0, full_output=True, **kw)
    return {"popt": out[0], "pcov": out[1], "nfev": int(out[2]["nfev"]), "mesg": out[3]}


def _nan_data() -> np.ndarray:
    y = Y.copy()
    y[3] = np.nan
    return y


# keyword, the paths that take it, (values a), (values b), the data, what must differ.
CHANGES: list[tuple[str, tuple[str, ...], dict[str, Any], dict[str, Any], str, str]] = [
    ("ftol", PATHS, {}, {"ftol": 0.1}, "clean", "fewer"),
    ("xtol", PATHS, {}, {"xtol": 0.1}, "clean", "fewer"),
    ("gtol", PATHS, {}, {"gtol": 10.0}, "clean", "fewer"),
    ("x_scale", PATHS[:3], {}, {"x_scale": [10.0, 0.1, 1.0]}, "clean", "run"),
    ("loss", PATHS, {}, {"loss": "soft_l1"}, "outliers", "popt"),
    (
        "f_scale",
        PATHS,
        {"loss": "soft_l1"},
        {"loss": "soft_l1", "f_scale": 0.05},
        "outliers",
        "popt",
    ),
    ("bounds", PATHS, {}, {"bounds": ([0, 0, -10], [10, 10, 0.45])}, "clean", "popt"),
    ("method", PATHS[:3], {"method": "lm"}, {"method": "trf", "max_nfev": 3}, "clean", "raises"),
    ("jac", PATHS[:3], {}, {"jac": "3-point"}, "clean", "run"),
    ("diff_step", PATHS[:3], {}, {"diff_step": 0.1}, "clean", "run"),
    (
        "absolute_sigma",
        PATHS,
        {"sigma": 0.1 + 0 * X},
        {"sigma": 0.1 + 0 * X, "absolute_sigma": True},
        "clean",
        "pcov",
    ),
    ("nan_policy", PATHS, {"nan_policy": "raise"}, {"nan_policy": "omit"}, "nan", "raises"),
    ("check_finite", PATHS[:3], {}, {"check_finite": False, "nan_policy": "omit"}, "nan", "raises"),
]


def _data(kind: str) -> np.ndarray:
    return {"clean": Y, "outliers": Y_OUTLIERS, "nan": _nan_data()}[kind]


def _run(path: str, y: np.ndarray, monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        try:
            return _fit(path, y, monkeypatch, **kw)
        except (ValueError, RuntimeError) as err:
            return err


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("keyword", "paths", "a", "b", "data", "differs"), CHANGES, ids=[c[0] for c in CHANGES]
)
def test_each_keyword_changes_the_fit_on_every_path(
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    keyword: str,
    paths: tuple[str, ...],
    a: dict[str, Any],
    b: dict[str, Any],
    data: str,
    differs: str,
) -> None:
    if path not in paths:
        pytest.skip(f"curve_fit_batch has no {keyword} (curve_fit's own)")
    y = _data(data)
    first, second = _run(path, y, monkeypatch, a), _run(path, y, monkeypatch, b)
    if differs == "raises":  # exactly one of the two refuses or runs out of evaluations
        assert isinstance(first, Exception) != isinstance(second, Exception), (first, second)
        return
    assert not isinstance(first, Exception), first
    assert not isinstance(second, Exception), second
    if differs == "fewer":
        assert second["nfev"] < first["nfev"], (first["nfev"], second["nfev"])
    elif differs == "popt":
        assert not np.allclose(first["popt"], second["popt"], rtol=1e-4, atol=0)
    elif differs == "pcov":
        assert not np.allclose(first["pcov"], second["pcov"], rtol=1e-3, atol=0)
    else:  # another run: other evaluations, other digits, or another path's message
        assert (
            first["nfev"] != second["nfev"]
            or first["mesg"] != second["mesg"]
            or not np.array_equal(first["popt"], second["popt"])
        )


def test_the_evaluation_budget_under_either_name_ends_every_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("max_nfev", "maxfev"):
        for path in PATHS[:3]:
            with pytest.raises(RuntimeError, match="Optimal parameters not found"):
                _fit(path, Y, monkeypatch, **{name: 2})
        with pytest.warns(OptimizeWarning, match="did not converge"):
            out = _fit("batch", Y, monkeypatch, **{name: 2})
        assert out["nfev"] <= 2


def test_full_output_adds_scipy_returns_on_every_path(monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = scipy_optimize.curve_fit(numpy_decay, X, Y, P0, full_output=True)
    for path in PATHS[:3]:
        if path == "torch_engine":
            monkeypatch.setattr(scipy_face, "SMALL_POINTS", 10)
        f = numpy_decay if path == "numpy" else torch_decay
        assert len(curve_fit(f, X, Y, P0)) == 2
        ours = curve_fit(f, X, Y, P0, full_output=True)
        assert len(ours) == len(theirs) == 5
        assert set(ours[2]) >= {"nfev", "fvec"} and isinstance(ours[3], str)
        assert ours[4] in (1, 2, 3, 4)
    assert len(curve_fit_batch(torch_decay, X, np.stack([Y, Y]), P0)) == 2
    assert len(curve_fit_batch(torch_decay, X, np.stack([Y, Y]), P0, full_output=True)) == 3


# keyword values SciPy refuses (method="trf" takes every least_squares keyword).
REFUSALS: list[tuple[str, dict[str, Any], bool]] = [
    ("ftol", {"ftol": "tight"}, True),
    ("max_nfev", {"max_nfev": 0}, True),
    ("x_scale", {"x_scale": -1.0}, False),
    ("loss", {"loss": "l1"}, True),
    ("f_scale", {"loss": "soft_l1", "f_scale": 0.0}, True),
    ("bounds", {"bounds": (1.0, 0.0)}, True),
    ("bounds_shape", {"bounds": ([0, 0], [1, 1])}, True),
    ("method", {"method": "newton"}, False),
    ("method_lm_bounds", {"method": "lm", "bounds": (0, 10)}, False),
    ("jac", {"jac": "4-point"}, False),
    ("nan_policy", {"nan_policy": "drop"}, True),
    ("nan_policy_propagate", {"nan_policy": "propagate", "check_finite": False}, False),
    ("check_finite", {"check_finite": True}, False),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("name", "kw", "batch"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_values_raise_scipys_exception_on_every_path(
    monkeypatch: pytest.MonkeyPatch, path: str, name: str, kw: dict[str, Any], batch: bool
) -> None:
    y = _nan_data() if name.startswith(("nan_policy", "check_finite")) else Y
    scipy_kw = {"method": "trf", **kw} if "method" not in kw else kw
    try:
        scipy_optimize.curve_fit(numpy_decay, X, y, P0, **scipy_kw)
    except Exception as err:  # the class is what the test compares
        # The builtin class a user catches (NumPy's UFuncTypeError is a TypeError).
        expected = next(c for c in type(err).__mro__ if c.__module__ == "builtins")
    else:
        pytest.fail(f"SciPy accepts {kw}")
    if path == "batch":
        if not batch:
            pytest.skip(f"curve_fit_batch has no {name} keyword")
        kw = {k: v for k, v in kw.items() if k != "check_finite"}
    with pytest.raises(expected):
        _fit(path, y, monkeypatch, **kw)


def test_loose_tolerances_stop_a_large_torch_fit_sooner() -> None:
    """The issue's fit: a torch model of 200,000 points on the sliced engine stops sooner
    with ftol = xtol = gtol = 1e-2, as SciPy's and the NumPy model's do."""
    x = np.linspace(0.0, 4.0, 200_000)
    y = 2.5 * np.exp(-1.3 * x) + 0.5 + 0.01 * np.random.default_rng(0).standard_normal(x.size)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    assert x.size > scipy_face.SMALL_POINTS
    runs: dict[str, list[int]] = {}
    fits: list[tuple[str, Callable[..., Any], Any, Any]] = [
        ("torch", torch_decay, xt, yt),
        ("numpy", numpy_decay, x, y),
    ]
    for name, f, xs, ys in fits:
        for kw in ({}, {"ftol": 1e-2, "xtol": 1e-2, "gtol": 1e-2}):
            out = curve_fit(f, xs, ys, P0, full_output=True, **kw)
            runs.setdefault(name, []).append(int(out[2]["nfev"]))
    assert runs["torch"][1] < runs["torch"][0], runs
    assert runs["numpy"][1] < runs["numpy"][0], runs


def test_the_lowered_threshold_sends_a_torch_fit_to_the_sliced_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = _fit("torch_small", Y, monkeypatch)
    engine = _fit("torch_engine", Y, monkeypatch)
    assert "termination condition" in small["mesg"]  # SciPy's words: the small path
    assert "termination condition" not in engine["mesg"]  # LMA's reasons: the engine
    np.testing.assert_allclose(engine["popt"], small["popt"], rtol=1e-6)
