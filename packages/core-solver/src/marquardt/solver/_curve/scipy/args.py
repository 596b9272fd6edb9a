"""SciPy's ``curve_fit`` arguments, checked and translated before any work.

Each check raises SciPy's exception type with SciPy's message, followed by a ``HINT``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from marquardt.devices.messages import with_hint

from ..._lm.robust import ROBUST_LOSSES, loss_refusal
from ..bounds_rule import misordered
from .providers import Whitening

__all__ = [
    "bound_sides",
    "check_bound_order",
    "checked_loss",
    "diff_step",
    "feasible_start",
    "hinted",
    "non_negative",
    "numpy_array",
    "omit_nan",
    "parameter_count",
    "refuse_non_finite",
    "scipy_bounds",
    "whitening",
]


def hinted(kind: type[Exception], scipy_text: str, hint: str) -> Exception:
    """``kind`` raised with SciPy's own text (its users' filters and tests match it) and ours
    hint after it."""
    return kind(with_hint(scipy_text, hint))


def not_found(message: str, max_nfev: int) -> RuntimeError:
    """SciPy's error for a fit that ran out of evaluations (``message``: the status's)."""
    return RuntimeError(
        "Optimal parameters not found: "
        + message
        + f" HINT: raise maxfev (it was {max_nfev}) or start nearer the optimum"
    )


def parameter_count(f: Callable[..., Any]) -> int:
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError) as err:
        raise hinted(
            ValueError, "Unable to determine number of fit parameters.", "pass p0"
        ) from err
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) < 2:
        raise hinted(
            ValueError,
            "Unable to determine number of fit parameters.",
            "f(x, *params) has no named parameters to count: pass p0, one value per parameter",
        )
    return len(positional) - 1


def bound_sides(bounds: Any) -> tuple[Any, Any]:
    """(lower, upper) of SciPy's ``bounds``: a pair, or a ``scipy.optimize.Bounds``."""
    try:
        from scipy.optimize import Bounds as ScipyBounds
    except ImportError:  # pragma: no cover
        ScipyBounds = ()  # type: ignore[assignment,misc,unused-ignore]
    if ScipyBounds and isinstance(bounds, ScipyBounds):
        return bounds.lb, bounds.ub
    try:
        lb, ub = bounds
    except (TypeError, ValueError) as err:
        raise hinted(
            ValueError,
            "`bounds` must contain 2 elements.",
            "pass bounds=(lower, upper), each a number or one per parameter",
        ) from err
    return lb, ub


def check_bound_order(lower: np.ndarray, upper: np.ndarray) -> None:
    """SciPy's refusal of bounds with NaN or a lower bound not strictly below its upper one."""
    bad = misordered(lower, upper)
    if bad:
        raise hinted(
            ValueError,
            "Each lower bound must be strictly less than each upper bound.",
            f"at {bad[0]}: lower {lower[bad[0]]!r}, upper {upper[bad[0]]!r}; "
            "use ±np.inf for no bound",
        )


def scipy_bounds(bounds: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """SciPy's bounds as (lower, upper), (n,) each, checked."""
    sides = []
    for side in bound_sides(bounds):
        a = np.asarray(side, dtype=np.float64)
        if a.ndim == 0:
            a = np.full(n, float(a))
        if a.shape != (n,):
            raise hinted(
                ValueError,
                "Inconsistent shapes between bounds and `x0`.",
                f"give each bound as one number or {n} values (one per parameter)",
            )
        sides.append(a)
    lower, upper = sides
    check_bound_order(lower, upper)
    return lower, upper


def feasible_start(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """SciPy's start without p0: ones, the middle of two finite bounds, one inside a single one."""
    p0 = np.ones_like(lower)
    lo, hi = np.isfinite(lower), np.isfinite(upper)
    p0[lo & hi] = 0.5 * (lower[lo & hi] + upper[lo & hi])
    p0[lo & ~hi] = lower[lo & ~hi] + 1.0
    p0[~lo & hi] = upper[~lo & hi] - 1.0
    return p0


def non_negative(name: str, value: Any, *, positive: bool = False) -> float:
    """``value`` as a float: TypeError when it is no number, ValueError when negative or NaN
    (or not positive, with ``positive``)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.floating, np.integer))
    v = float(value) if ok else math.nan
    if not ok or math.isnan(v) or v < 0 or (positive and v <= 0):
        raise hinted(
            ValueError if ok else TypeError,  # SciPy's classes: a bad number, not a number
            f"`{name}` must be a {'positive' if positive else 'non-negative'} number, got {value!r}.",
            f"pass e.g. {name}=1e-8",
        )
    return v


def checked_loss(loss: Any, f_scale: Any) -> tuple[Any, Any]:
    """(loss, f_scale) as given, refused with SciPy's messages where `loss_refusal` says so
    (f_scale may hold one value per fit)."""
    refused = loss_refusal(loss, f_scale)
    if refused == "loss":
        raise hinted(
            ValueError,
            f"`loss` must be one of {ROBUST_LOSSES} or a callable.",
            f"got {loss!r}; a callable loss is not supported here: use one of the named ones",
        )
    if refused == "f_scale":
        raise hinted(
            ValueError,
            f"`f_scale` must be a positive number, got {f_scale!r}.",
            "pass the residual size beyond which a point counts as an outlier, e.g. f_scale=0.1",
        )
    return loss, f_scale


def diff_step(kwargs: dict[str, Any], n: int) -> np.ndarray | None:
    """``diff_step`` (least_squares), or leastsq's ``epsfcn`` as the relative step
    √epsfcn; checked: positive, finite, one value or one per parameter."""
    given, name = kwargs.get("diff_step"), "diff_step"
    if given is None and kwargs.get("epsfcn") is not None:
        given, name = kwargs["epsfcn"], "epsfcn"
    if given is None:
        return None
    try:
        step = np.broadcast_to(np.asarray(given, dtype=np.float64), (n,)).copy()
    except (TypeError, ValueError) as err:
        raise hinted(
            ValueError,
            f"`{name}` must be a positive number or one per parameter, got {given!r}.",
            f"pass e.g. {name}=1e-6",
        ) from err
    if not np.all(np.isfinite(step)) or np.any(step <= 0):
        raise hinted(
            ValueError,
            f"`{name}` must be a positive number or one per parameter, got {given!r}.",
            f"pass e.g. {name}=1e-6",
        )
    return np.sqrt(step) if name == "epsfcn" else step


def numpy_array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.float64).numpy()
    return np.asarray(value, dtype=np.float64)


def refuse_non_finite(name: str, a: np.ndarray) -> None:
    if not np.all(np.isfinite(a)):
        raise hinted(
            ValueError,
            "array must not contain infs or NaNs",
            f"{name} holds {int(np.sum(~np.isfinite(a)))} NaN/inf values: drop them, or pass "
            "nan_policy='omit'",
        )


def whitening(sigma: Any, n: int) -> Whitening:
    if sigma is None:
        return Whitening(None, None)
    s = numpy_array(sigma)
    if s.size == 1 or s.shape == (n,):
        if np.any(s <= 0) or not np.all(np.isfinite(s)):
            raise hinted(
                ValueError,
                "`sigma` must be positive and finite.",
                "give each point a positive standard deviation",
            )
        return Whitening(np.broadcast_to(1.0 / s.reshape(-1), (n,)).copy(), None)
    if s.shape == (n, n):
        try:
            factor = np.linalg.cholesky(s)
        except np.linalg.LinAlgError as err:
            raise hinted(
                ValueError,
                "`sigma` must be positive definite.",
                "a 2-D sigma is the covariance matrix of ydata: symmetric, positive definite",
            ) from err
        return Whitening(None, factor)
    raise hinted(
        ValueError,
        "`sigma` has incorrect shape.",
        f"pass a scalar, {n} standard deviations, or a {n} × {n} covariance matrix",
    )


def omit_nan(x: Any, y: np.ndarray, sigma: Any) -> tuple[Any, np.ndarray, Any]:
    xa = np.asarray(x, dtype=np.float64)
    nan_x = np.isnan(xa)
    per_point = nan_x.any(axis=tuple(range(nan_x.ndim - 1))) if nan_x.ndim > 1 else nan_x
    bad = np.asarray(per_point | np.isnan(y) if np.ndim(per_point) else np.isnan(y))
    keep = ~bad
    if sigma is not None:
        s = numpy_array(sigma)
        if s.ndim == 1 and s.size == y.size:
            sigma = s[keep]
        elif s.ndim == 2:
            sigma = s[keep][:, keep]
    return xa[..., keep], y[keep], sigma
