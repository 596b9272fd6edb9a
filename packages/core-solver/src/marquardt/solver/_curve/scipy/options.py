"""SciPy's ``curve_fit`` keywords, translated once into `FitOptions`, the object every path reads.

`fit_options` checks each keyword with SciPy's exception type and message (and a HINT)
and turns it into our own terms: the start and the bounds, the method, the provider of J
(a callable, a difference scheme, its relative step), the parameter scaling, the robust
loss, the `FitTests` (the fit tests, SciPy's stopping tests of one fit, and its evaluation
budget), the
covariance's convention and what the caller gets back. The small path
(``to_single.py``), the sliced engine (``to_large.py``) and ``curve_fit_batch``
(`fit_tests`, `checked_loss`, `checked_bounds`) read these values and never the keywords
themselves, so that no keyword means one thing on one path and is dropped on another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..fit_tests import FitTests
from .args import (
    checked_loss,
    diff_step,
    feasible_start,
    hinted,
    non_negative,
    numpy_array,
    parameter_count,
    scipy_bounds,
)

__all__ = [
    "ENGINE_KEYWORDS",
    "METHODS",
    "SCHEMES",
    "SCIPY_KEYWORDS",
    "FitOptions",
    "default_max_nfev",
    "fit_options",
    "fit_tests",
]

METHODS = ("trf", "dogbox", "lm")
SCHEMES = ("2-point", "3-point", "cs")
#: The sliced engine's own keywords (`curve_fit_result`'s), which send a torch fit there.
ENGINE_KEYWORDS = frozenset({"device", "dtype", "slice_size", "max_steps"})
#: SciPy's keywords that ``curve_fit`` passes on to ``least_squares`` / ``leastsq``.
SCIPY_KEYWORDS = frozenset(
    {
        "maxfev",
        "max_nfev",
        "ftol",
        "xtol",
        "gtol",
        "x_scale",
        "diff_step",
        "loss",
        "f_scale",
        "epsfcn",
        "factor",
        "col_deriv",
        "tr_solver",
        "tr_options",
        "verbose",
        "jac_sparsity",
        "lsmr_tol",
        "max_iter",
    }
)


def default_max_nfev(method: str, params: int) -> int:
    """SciPy's evaluation budget when none is given: 200·(P + 1) for ``"lm"`` (leastsq's
    maxfev for a J it is given), 100·P for ``"trf"`` and ``"dogbox"``."""
    return 200 * (params + 1) if method == "lm" else 100 * params


def fit_tests(
    ftol: Any,
    xtol: Any,
    gtol: Any,
    max_nfev: Any,
    *,
    method: str,
    params: int,
    dtype: torch.dtype = torch.float64,
) -> FitTests:
    """The checked `FitTests`: each tolerance non-negative, 1e-8 when ``None`` (ftol and
    xtol at least 10·ε of ``dtype``, whose rounding they could not see below); the budget a
    positive integer, `default_max_nfev` when ``None``.

    Raises:
        ValueError: a negative or non-numeric tolerance, a budget below 1 (SciPy's texts).
    """
    floor = max(1e-8, 10 * float(torch.finfo(dtype).eps))
    given = {"ftol": ftol, "xtol": xtol, "gtol": gtol}
    tol = {
        k: non_negative(k, v) if v is not None else (1e-8 if k == "gtol" else floor)
        for k, v in given.items()
    }
    budget = default_max_nfev(method, params) if max_nfev is None else max_nfev
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
        raise hinted(
            ValueError,
            f"`max_nfev` must be None or a positive integer, got {budget!r}.",
            "pass e.g. max_nfev=1000",
        )
    return FitTests(max_nfev=int(budget), **tol)


@dataclass(frozen=True)
class FitOptions:
    """``curve_fit``'s keywords in our terms, checked (`fit_options`).

    Arguments:
        start: the feasible start p0 (P,), float64.
        lower: the lower bounds (P,), −inf for none.
        upper: the upper bounds (P,), +inf for none.
        method: ``"lm"``, ``"trf"`` or ``"dogbox"``: the covariance's formula and the budget.
        jac: J as a callable, a difference scheme, or ``None`` (2-point differences).
        diff_step: the relative difference step per parameter, or ``None`` (SciPy's).
        x_scale: fixed parameter scales (P,), or ``None`` (MINPACK's from J's columns).
        loss: the robust loss's name.
        f_scale: the residual size at which it sets in.
        tests: the fit tests and the evaluation budget.
        absolute_sigma: whether sigma is absolute (pcov not scaled by χ²ᵣ).
        full_output: whether ``infodict``, ``mesg`` and ``ier`` are returned too.
        check_finite: whether NaN/inf in the data are refused.
        nan_policy: ``None``, ``"raise"`` or ``"omit"``.
        engine: the sliced engine's keywords given (``ENGINE_KEYWORDS``).
    """

    start: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    method: str
    jac: Callable[..., Any] | str | None
    diff_step: np.ndarray | None
    x_scale: np.ndarray | None
    loss: str
    f_scale: float
    tests: FitTests
    absolute_sigma: bool
    full_output: bool
    check_finite: bool
    nan_policy: str | None
    engine: Mapping[str, Any]

    @property
    def params(self) -> int:
        return int(self.start.size)

    @property
    def differences(self) -> bool:
        """Whether J is asked of something other than autodiff: a callable, a named
        difference scheme or step, or fixed scales (which the sliced engine does not take)."""
        return self.jac is not None or self.diff_step is not None or self.x_scale is not None


def _start(f: Callable[..., Any], p0: Any, bounds: Any) -> tuple[np.ndarray, ...]:
    """(start, lower, upper): p0 or SciPy's feasible start, inside the checked bounds."""
    n = parameter_count(f) if p0 is None else int(np.atleast_1d(numpy_array(p0)).size)
    lower, upper = scipy_bounds(bounds, n)
    if p0 is None:
        start = feasible_start(lower, upper)
    else:
        start = np.atleast_1d(numpy_array(p0)).reshape(-1).copy()
    if not np.all(np.isfinite(start)):
        raise hinted(ValueError, "`x0` must be finite.", "pass a finite p0")
    if np.any((start < lower) | (start > upper)):
        raise hinted(
            ValueError,
            "Initial guess is outside of provided bounds",
            f"p0 {start.tolist()} lies outside the bounds: start within them, or leave p0 out "
            "for SciPy's feasible start",
        )
    return start, lower, upper


def _method(method: str | None, lower: np.ndarray, upper: np.ndarray) -> str:
    bounded = bool(np.any(np.isfinite(lower) | np.isfinite(upper)))
    if method is None:
        method = "trf" if bounded else "lm"
    if method not in METHODS:
        raise hinted(
            ValueError,
            "`method` must be 'trf', 'dogbox' or 'lm'.",
            f"got {method!r}; all three run the same LM here",
        )
    if method == "lm" and bounded:
        raise hinted(
            ValueError,
            "Method 'lm' only works for unconstrained problems. Use 'trf' or 'dogbox' instead.",
            "leave method out: with bounds it defaults to 'trf'",
        )
    return method


def _x_scale(x_scale: Any, n: int) -> np.ndarray | None:
    if x_scale is None or (isinstance(x_scale, str) and x_scale == "jac"):
        return None
    scale = None
    with suppress(TypeError, ValueError):
        scale = np.broadcast_to(np.asarray(x_scale, dtype=np.float64), (n,)).copy()
    if scale is None or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise hinted(
            ValueError,
            "`x_scale` must be 'jac' or array_like with positive numbers.",
            f"got {x_scale!r}",
        )
    return scale


def _jac(jac: Any, column_major: bool) -> Callable[..., Any] | str | None:
    if jac is not None and not callable(jac) and jac not in SCHEMES:
        raise hinted(
            ValueError,
            "`jac` must be '2-point', '3-point', 'cs' or callable.",
            f"got {jac!r}",
        )
    if callable(jac) and column_major:  # leastsq's Jacobian by columns: P × N
        by_columns = jac

        def rows(x: Any, *p: Any) -> Any:
            return np.asarray(by_columns(x, *p)).T

        return rows
    if callable(jac) or jac is None:
        return jac  # type: ignore[no-any-return]
    return str(jac)


def fit_options(
    f: Callable[..., Any],
    p0: Any,
    bounds: Any,
    method: str | None,
    jac: Any,
    *,
    kwargs: Mapping[str, Any],
) -> FitOptions:
    """``curve_fit``'s arguments (but the data) checked and translated, before any work.

    Arguments:
        f: the model (its signature counts the parameters when ``p0`` is ``None``).
        p0: the start, or ``None``.
        bounds: ``(lower, upper)`` or a ``scipy.optimize.Bounds``.
        method: SciPy's method name, or ``None``.
        jac: SciPy's ``jac``.
        kwargs: the other keywords: SciPy's ``absolute_sigma``, ``check_finite``
            (``None``: True unless ``nan_policy`` is given), ``full_output`` and
            ``nan_policy``, and the rest of SciPy's and the engine's (checked by the caller
            for unknown names).

    Returns:
        The `FitOptions`.

    Raises:
        ValueError: a value SciPy refuses, with SciPy's message and a HINT.
    """
    start, lower, upper = _start(f, p0, bounds)
    method = _method(method, lower, upper)
    nan_policy, check_finite = kwargs.get("nan_policy"), kwargs.get("check_finite")
    if nan_policy not in (None, "raise", "omit", "propagate"):
        raise hinted(
            ValueError,
            "nan_policy must be one of {None, 'raise', 'omit'}",
            f"got {nan_policy!r}",
        )
    loss, f_scale = checked_loss(kwargs.get("loss", "linear"), kwargs.get("f_scale", 1.0))
    f_scale = float(f_scale)
    budget = kwargs.get("max_nfev", kwargs.get("maxfev"))
    tests = fit_tests(
        kwargs.get("ftol"),
        kwargs.get("xtol"),
        kwargs.get("gtol"),
        budget,
        method=method,
        params=start.size,
    )
    return FitOptions(
        start=start,
        lower=lower,
        upper=upper,
        method=method,
        jac=_jac(jac, bool(kwargs.get("col_deriv"))),
        diff_step=diff_step(dict(kwargs), start.size),
        x_scale=_x_scale(kwargs.get("x_scale"), start.size),
        loss=loss,
        f_scale=f_scale,
        tests=tests,
        absolute_sigma=bool(kwargs.get("absolute_sigma", False)),
        full_output=bool(kwargs.get("full_output", False)),
        check_finite=nan_policy is None if check_finite is None else bool(check_finite),
        nan_policy=nan_policy,
        engine={k: kwargs[k] for k in ENGINE_KEYWORDS if k in kwargs},
    )
