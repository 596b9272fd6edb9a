"""``curve_fit_batch``'s starting parameters, checked before any work, and its keywords
beyond ``curve_fit``'s: the fixed parameters, the estimator and the iteration limit.

* p0's width against the parameters f's signature names (a p0 of another width, or one
  given transposed, (P, M), is refused naming both), and its values finite (the fits whose
  p0 holds NaN or inf are named);
* a p0 outside the bounds is projected into the box, as Gpufit does, with one
  ``OptimizeWarning`` counting the fits moved (``curve_fit`` keeps SciPy's refusal);
* ``fixed``: a boolean mask, (P,) or (M, P), of the parameters held at their p0 (Gpufit's
  ``parameters_to_fit``, inverted);
* ``max_iterations``: Gpufit's limit by iterations, each one trial step (one evaluation of
  f and J), so k iterations are k + 1 evaluations with the start's.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ..._errors import OptimizeWarning, user_stacklevel
from ..scipy.args import hinted

__all__ = [
    "ESTIMATORS",
    "checked_estimator",
    "evaluation_budget",
    "fixed_mask",
    "projected",
    "start_values",
]

#: The estimators ``curve_fit_batch`` and ``curve_fit`` take: least squares, and Gpufit's
#: Poisson maximum likelihood (``_curve.batched_lm.estimators``).
ESTIMATORS = ("lse", "poisson")
#: The fits named in a message before "…".
NAMED = 5


def _named(index: np.ndarray) -> str:
    shown = ", ".join(str(int(i)) for i in index[:NAMED])
    return shown + (", …" if index.size > NAMED else "")


def signature_widths(f: Callable[..., Any]) -> tuple[int, int | None] | None:
    """(fewest, most) parameters f(x, *p) takes after x (most None for ``*p``), or None
    when its signature says nothing (a builtin, or ``f(*args)``)."""
    try:
        parameters = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind == p.VAR_POSITIONAL for p in parameters)
    if not positional:
        return None
    required = sum(p.default is inspect.Parameter.empty for p in positional[1:])
    return required, None if variadic else len(positional) - 1


def _width_refusal(f: Callable[..., Any], shape: tuple[int, ...], fits: int) -> None:
    widths = signature_widths(f)
    if widths is None or len(shape) not in (1, 2):
        return
    fewest, most = widths
    width = shape[-1]
    if fewest <= width and (most is None or width <= most):
        return
    count = str(fewest) if most == fewest else f"{fewest} to {'any' if most is None else most}"
    named = fewest if most is None else most
    if len(shape) == 2 and shape[0] == named and shape[1] == fits:
        raise hinted(
            ValueError,
            f"`p0` has shape {shape}: f takes {count} parameters and ydata holds {fits} fits.",
            f"p0 looks transposed: pass p0.T, shape ({fits}, {named}), one row per fit",
        )
    raise hinted(
        ValueError,
        f"`p0` has shape {shape}: f takes {count} parameters after x and ydata holds {fits} fits.",
        f"give p0 as ({named},) shared by the fits, or ({fits}, {named}), one row per fit",
    )


def start_values(f: Callable[..., Any], p0: Any, fits: int) -> np.ndarray:
    """p0 as (M, P) float64, checked against f's signature and for finite values.

    Arguments:
        f: the model f(x, *p).
        p0: (P,) shared or (M, P) per fit.
        fits: M.

    Returns:
        p0 broadcast to (M, P).

    Raises:
        ValueError: a width f's signature does not take, a transposed p0, a shape of
            neither form, or NaN/inf in the fits named.
    """
    try:
        a = np.asarray(p0.detach().cpu() if hasattr(p0, "detach") else p0, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise hinted(ValueError, "`p0` must be numbers.", f"got {type(p0).__name__}") from err
    _width_refusal(f, a.shape, fits)
    if a.ndim not in (1, 2) or (a.ndim == 2 and a.shape[0] != fits) or a.shape[-1] == 0:
        raise hinted(
            ValueError,
            f"`p0` has shape {a.shape} for {fits} fits.",
            f"give (P,) values shared by every fit, or ({fits}, P), one row per fit",
        )
    start = np.broadcast_to(a, (fits, a.shape[-1])).copy()
    bad = np.flatnonzero(~np.isfinite(start).all(1))
    if bad.size:
        raise hinted(
            ValueError,
            "`x0` must be finite.",
            f"p0 holds NaN or inf in {bad.size} of {fits} fits ({_named(bad)}): give finite starts",
        )
    return start


def projected(start: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """p0 clipped into l ≤ p ≤ u (Gpufit's convention), with one ``OptimizeWarning``
    counting the fits it moved; the starts inside are returned as they are."""
    outside = np.any((start < lower) | (start > upper), axis=1)
    if not outside.any():
        return start
    moved = np.flatnonzero(outside)
    warnings.warn(
        f"p0 of {moved.size} of {start.shape[0]} fits lay outside the bounds and was projected "
        f"into them (fits {_named(moved)}) HINT: start within the bounds to keep your start",
        OptimizeWarning,
        stacklevel=user_stacklevel(),
    )
    clipped: np.ndarray = np.clip(start, lower, upper)
    return clipped


def fixed_mask(fixed: Any, fits: int, params: int) -> np.ndarray | None:
    """``fixed`` as an (M, P) boolean mask, None when nothing is fixed.

    Raises:
        ValueError: a mask of another shape, not boolean, or fixing every parameter of a fit.
    """
    if fixed is None:
        return None
    a = np.asarray(fixed.detach().cpu() if hasattr(fixed, "detach") else fixed)
    if a.dtype != np.bool_ or a.shape not in ((params,), (fits, params)):
        raise hinted(
            ValueError,
            f"`fixed` is {a.dtype} of shape {a.shape}.",
            f"give booleans, ({params},) shared or ({fits}, {params}) per fit, True where a "
            "parameter is held at its p0",
        )
    mask = np.broadcast_to(a, (fits, params)).copy()
    every = np.flatnonzero(mask.all(1))
    if every.size:
        raise hinted(
            ValueError,
            f"`fixed` holds every parameter of {every.size} fits ({_named(every)}).",
            "leave at least one parameter of each fit free",
        )
    return mask if mask.any() else None


def checked_estimator(estimator: Any) -> str:
    """``estimator`` checked: ``"lse"`` or ``"poisson"``."""
    if estimator not in ESTIMATORS:
        raise hinted(
            ValueError,
            f"estimator must be one of {ESTIMATORS}, got {estimator!r}.",
            "'lse' for least squares, 'poisson' for Poisson maximum likelihood (counts)",
        )
    return str(estimator)


def evaluation_budget(max_nfev: Any, max_iterations: Any) -> Any:
    """The evaluation budget of ``max_nfev`` and ``max_iterations`` together: k iterations
    are k + 1 evaluations; with both, the one reached first."""
    if max_iterations is None:
        return max_nfev
    if (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, (int, np.integer))
        or max_iterations < 0
    ):
        raise hinted(
            ValueError,
            f"`max_iterations` must be None or a non-negative integer, got {max_iterations!r}.",
            "pass e.g. max_iterations=25 (Gpufit's max_number_iterations)",
        )
    budget = int(max_iterations) + 1
    if isinstance(max_nfev, (int, np.integer)) and not isinstance(max_nfev, bool):
        return min(budget, int(max_nfev))
    return budget if max_nfev is None else max_nfev
