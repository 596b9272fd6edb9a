"""Curve-fitting problems for ``curve_fit``, each with a torch model, data and a start.

Every model is written once with torch operations; the NumPy function and the exact
Jacobian that SciPy's reference fits use are derived from it (``scipy_reference``), so
both sides fit the same function, SciPy with an exact Jacobian (no finite differences).
Data are synthetic with a fixed seed, except ``misra1a`` and ``mgh09`` (NIST StRD, the
data in ``problems``), fitted from NIST's second start.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from problems import MGH09_X, MGH09_Y, MISRA1A_X, MISRA1A_Y

from marquardt.testing.curves import decay
from marquardt.testing.nist import nist_problem

Model = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class CurveProblem:
    """f(x, *p), data (x: (N,) or (k, N); y: (N,)), a start p0 and per-point σ."""

    name: str
    f: Model
    x: np.ndarray
    y: np.ndarray
    p0: list[float]
    sigma: np.ndarray


def numpy_model(f: Model) -> Callable[..., np.ndarray]:
    def call(x: np.ndarray, *p: float) -> np.ndarray:
        with torch.no_grad():
            params = [torch.tensor(v, dtype=torch.float64) for v in p]
            return f(torch.as_tensor(x, dtype=torch.float64), *params).numpy()

    return call


def numpy_jacobian(f: Model) -> Callable[..., np.ndarray]:
    """∂f/∂p (N × P) by autograd, as SciPy's ``jac=`` expects."""

    def jac(x: np.ndarray, *p: float) -> np.ndarray:
        xt = torch.as_tensor(x, dtype=torch.float64)

        def curve(theta: torch.Tensor) -> torch.Tensor:
            return f(xt, *theta.unbind())

        theta = torch.tensor(p, dtype=torch.float64)
        return torch.autograd.functional.jacobian(curve, theta).numpy()

    return jac


def _make(
    name: str, f: Model, x: np.ndarray, truth: list[float], p0: list[float], noise: float, seed: int
) -> CurveProblem:
    rng = np.random.default_rng(seed)
    clean = numpy_model(f)(x, *truth)
    y = clean + noise * rng.standard_normal(clean.shape)
    sigma = noise * (0.5 + rng.uniform(size=clean.shape))
    return CurveProblem(name, f, x, y, p0, sigma)


def _two_exp(x: torch.Tensor, a: Any, b: Any, c: Any, d: Any) -> torch.Tensor:
    return a * torch.exp(-b * x) + c * torch.exp(-d * x)


def _gaussian(x: torch.Tensor, a: Any, m: Any, s: Any, c: Any) -> torch.Tensor:
    return a * torch.exp(-0.5 * ((x - m) / s) ** 2) + c


def _rational(x: torch.Tensor, a: Any, b: Any, c: Any) -> torch.Tensor:
    return (a + b * x) / (1.0 + c * x)


def _surface(x: torch.Tensor, a: Any, b: Any, c: Any, d: Any) -> torch.Tensor:
    return a * torch.exp(-b * x[0] ** 2 - c * x[1] ** 2) + d * x[0] * x[1]


def _logistic(x: torch.Tensor, a: Any, k: Any, x0: Any) -> torch.Tensor:
    return a / (1.0 + torch.exp(-k * (x - x0)))


def _power(x: torch.Tensor, a: Any, b: Any) -> torch.Tensor:
    return a * x**b


def _damped_sine(x: torch.Tensor, a: Any, g: Any, w: Any, phi: Any) -> torch.Tensor:
    return a * torch.exp(-g * x) * torch.sin(w * x + phi)


def _lorentzian(x: torch.Tensor, a: Any, x0: Any, w: Any, c: Any) -> torch.Tensor:
    return a / (1.0 + ((x - x0) / w) ** 2) + c


def _nist(name: str, f: Model, xs: list[float], ys: list[float], p0: list[float]) -> CurveProblem:
    x = np.asarray(xs)
    sigma = 0.5 + 0.5 * np.abs(np.sin(np.arange(x.size)))
    return CurveProblem(name, f, x, np.asarray(ys), p0, sigma * float(np.std(ys)) * 1e-2)


@functools.cache
def curve_problems() -> tuple[CurveProblem, ...]:
    grid = np.random.default_rng(7).uniform(-2.0, 2.0, (2, 150))
    # name, model, x, true parameters, start, noise, seed: one row per problem
    # fmt: off
    rows: list[tuple[str, Model, np.ndarray, list[float], list[float], float, int]] = [
        ("exp_decay", decay, np.linspace(0, 4, 50), [2.5, 1.3, 0.5], [1, 0.5, 0], 0.02, 1),
        ("two_exp", _two_exp, np.linspace(0, 6, 80), [3, 2.5, 1, 0.3], [2, 1.5, 0.5, 0.1], 0.005, 2),
        ("gaussian", _gaussian, np.linspace(-5, 5, 101), [3, 0.5, 1.2, 0.2], [2, 0, 1, 0.1], 0.05, 3),
        ("rational", _rational, np.linspace(0, 3, 30), [1, 2, 0.5], [0.5, 1, 0.1], 0.01, 4),
        ("surface_2d", _surface, grid, [2, 0.7, 1.3, 0.4], [1, 1, 1, 0.1], 0.01, 5),
        ("logistic", _logistic, np.linspace(-4, 6, 60), [4, 1.5, 1], [1, 1, 0.5], 0.05, 6),
        ("power_law", _power, np.linspace(0.5, 10, 40), [1.7, 0.6], [1, 1], 0.02, 7),
        ("damped_sine", _damped_sine, np.linspace(0, 10, 200), [2, 0.3, 2.1, 0.4], [1.5, 0.2, 2.0, 0.2], 0.02, 8),
        ("lorentzian", _lorentzian, np.linspace(-3, 3, 90), [5, 0.3, 0.6, 0.5], [3, 0, 1, 0.1], 0.05, 9),
    ]
    # fmt: on
    return (
        *(_make(*row) for row in rows),
        _nist("misra1a", nist_problem("Misra1a").f, MISRA1A_X, MISRA1A_Y, [250.0, 5e-4]),
        _nist("mgh09", nist_problem("MGH09").f, MGH09_X, MGH09_Y, [0.25, 0.39, 0.415, 0.39]),
    )


CURVE_NAMES = tuple(p.name for p in curve_problems())


def curve_problem(name: str) -> CurveProblem:
    return next(p for p in curve_problems() if p.name == name)


@functools.cache
def scipy_reference(name: str, weighting: str) -> tuple[np.ndarray, np.ndarray]:
    """(popt, pcov) of ``scipy.optimize.curve_fit`` (MINPACK's LM, exact Jacobian, tight
    tolerances); ``weighting`` is "none", "sigma" or "absolute"."""
    from scipy.optimize import curve_fit as scipy_curve_fit

    prob = curve_problem(name)
    kwargs: dict[str, Any] = {}
    if weighting != "none":
        kwargs["sigma"] = prob.sigma
        kwargs["absolute_sigma"] = weighting == "absolute"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        popt, pcov = scipy_curve_fit(
            numpy_model(prob.f),
            prob.x,
            prob.y,
            prob.p0,
            jac=numpy_jacobian(prob.f),
            ftol=1e-15,
            xtol=1e-15,
            gtol=1e-15,
            maxfev=100_000,
            **kwargs,
        )
    return popt, pcov
