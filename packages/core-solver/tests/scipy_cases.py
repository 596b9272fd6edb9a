"""The model, data and SciPy references of the tests that check ``curve_fit`` against
``scipy.optimize.curve_fit`` (``curve/test_curve_fit_scipy*.py``): an exponential decay
written with NumPy or torch (``KINDS``), 50 noisy points and per-point σ."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

scipy_optimize = pytest.importorskip("scipy.optimize")

KINDS = ("numpy", "torch")
#: How near popt is to SciPy's: a NumPy model takes SciPy's steps and stops where SciPy
#: stops; a torch model's fit continues from there with autodiff's J to the least-squares
#: optimum, which SciPy's default ftol (1.5e-8) leaves up to 1e-5 (relative) away on the
#: decay below.
POPT_RTOL = {"numpy": 1e-6, "torch": 2e-5}


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


def numpy_decay(x: Any, a: Any, b: Any, c: Any) -> Any:
    return a * np.exp(-b * x) + c


RNG = np.random.default_rng(7)
X = np.linspace(0.0, 4.0, 50)
Y = numpy_decay(X, 2.5, 1.3, 0.5) + 0.2 * RNG.standard_normal(50)
SIGMA = 0.1 + 0.05 * RNG.random(50)


def reference(**kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        popt, pcov = scipy_optimize.curve_fit(numpy_decay, X, Y, **kwargs)
    return popt, pcov


def exact_pcov(
    p: np.ndarray, sigma: np.ndarray | None = None, absolute: bool = False
) -> np.ndarray:
    """s²(JᵀJ)⁻¹ from the analytic J of the decay at p (whitened by 1/σ)."""
    a, b, _ = p
    e = np.exp(-b * X)
    w = np.ones(50) if sigma is None else 1.0 / sigma
    j = np.stack([e, -a * X * e, np.ones(50)], axis=1) * w[:, None]
    r = (numpy_decay(X, *p) - Y) * w
    scale = 1.0 if absolute else float(r @ r) / 47
    return np.linalg.inv(j.T @ j) * scale
