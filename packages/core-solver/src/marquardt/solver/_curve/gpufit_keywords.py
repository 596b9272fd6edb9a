"""``curve_fit``'s keywords beyond SciPy's, from Gpufit: ``fixed`` and ``estimator``.

* ``fixed``: a boolean mask (P,) of the parameters held at their p0. The fit is
  ``curve_fit``'s own on the reduced model q ↦ f(x, *p(q)), p(q) holding the fixed values
  from p0 (with its bounds, ``jac``, ``x_scale`` and ``diff_step`` reduced alike), so that
  it equals a fit of the model with those values written in; popt gets the fixed values
  back, pcov zero rows and columns for them (``infodict``, with ``full_output``, is the
  reduced fit's). It runs without the compiled core.
* ``estimator="poisson"``: the fit is ``curve_fit_batch``'s with one data set and the
  Poisson maximum-likelihood estimator (f written with torch operations). SciPy's checks
  come first (a p0 outside the bounds is refused here, as SciPy refuses it), and SciPy's
  ``RuntimeError`` answers a fit that ran out of evaluations or could not start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .batch.curve_fit_batch import curve_fit_batch
from .batch.reduced import merged
from .batch.start import checked_estimator, fixed_mask
from .scipy.args import hinted, not_found
from .scipy.options import FitOptions

__all__ = ["gpufit_fit"]


def _reduced_keywords(kwargs: dict[str, Any], free: np.ndarray) -> dict[str, Any]:
    """``x_scale`` and ``diff_step`` given per parameter, reduced to the free ones."""
    out = dict(kwargs)
    for name in ("x_scale", "diff_step"):
        value = out.get(name)
        if value is not None and not isinstance(value, str) and np.size(value) == free.size:
            out[name] = np.asarray(value, dtype=np.float64)[free]
    return out


def _expanded(result: Any, values: np.ndarray, free: np.ndarray) -> Any:
    """popt and pcov of the reduced fit over every parameter (fixed: p0, zero covariance)."""
    popt, pcov, *rest = result
    index = np.flatnonzero(free)
    if isinstance(popt, torch.Tensor):
        full = torch.as_tensor(values, dtype=popt.dtype, device=popt.device).clone()
        where = torch.as_tensor(index, device=popt.device)
        full[where] = popt
        cov = torch.zeros((free.size, free.size), dtype=pcov.dtype, device=pcov.device)
        cov[where[:, None], where[None, :]] = pcov
        return (full, cov, *rest)
    full_np = values.astype(np.float64).copy()
    full_np[index] = popt
    cov_np = np.zeros((free.size, free.size))
    cov_np[np.ix_(index, index)] = pcov
    return (full_np, cov_np, *rest)


def _fixed_fit(
    fit: Callable[..., Any], free: np.ndarray, options: FitOptions, call: dict[str, Any]
) -> Any:
    f, jac, values = call.pop("f"), call.pop("jac"), options.start
    written = [float(v) for v in values]
    index = [int(k) for k in np.flatnonzero(free)]

    def reduced(x: Any, *q: Any) -> Any:
        return f(x, *merged(written, index, q))

    reduced_jac = jac
    if callable(jac):

        def reduced_jac(x: Any, *q: Any) -> Any:
            return np.asarray(jac(x, *merged(written, index, q)))[:, free]

    kwargs = _reduced_keywords(call.pop("kwargs"), free)
    result = fit(
        reduced,
        p0=values[free],
        bounds=(options.lower[free], options.upper[free]),
        jac=reduced_jac,
        compile=False,
        **call,
        **kwargs,
    )
    if not isinstance(result, tuple):  # pragma: no cover - curve_fit returns a tuple
        return result
    return _expanded(result, values, free)


def _poisson_fit(options: FitOptions, call: dict[str, Any]) -> Any:
    if call["jac"] is not None or call["sigma"] is not None or options.engine:
        raise hinted(
            ValueError,
            "estimator='poisson' takes neither jac, sigma nor the engine's keywords.",
            "J comes from autodiff of the torch model, the counts' variance from the model",
        )
    ydata = call["ydata"]
    y = (
        ydata.reshape(1, -1)
        if isinstance(ydata, torch.Tensor)
        else np.asarray(ydata, dtype=np.float64).reshape(1, -1)
    )
    tests = options.tests
    popt, pcov, info = curve_fit_batch(
        call["f"],
        call["xdata"],
        y,
        options.start,
        bounds=(options.lower, options.upper),
        nan_policy="omit" if options.nan_policy == "omit" else None,
        ftol=tests.ftol,
        xtol=tests.xtol,
        gtol=tests.gtol,
        max_nfev=tests.max_nfev,
        full_output=True,
        compile=False,
        fixed=call["fixed"],
        estimator="poisson",
    )
    status = int(info["status"][0])
    message = info["messages"][status]
    if status == 0:
        raise not_found(message, tests.max_nfev)
    if status < -1:
        raise RuntimeError(f"Optimal parameters not found: {message}")
    if not options.full_output:
        return popt[0], pcov[0]
    infodict = {k: info[k][0] for k in ("nfev", "njev", "steps", "cost", "chi_square")}
    return popt[0], pcov[0], infodict, message, status


def gpufit_fit(fit: Callable[..., Any], options: FitOptions, call: dict[str, Any]) -> Any:
    """``curve_fit`` with ``fixed`` or ``estimator`` (module docstring).

    Arguments:
        fit: ``curve_fit`` itself (for the reduced model's fit).
        options: the call's checked options (SciPy's checks done).
        call: ``curve_fit``'s arguments by name: f, xdata, ydata, sigma, absolute_sigma,
            check_finite, method, jac, full_output, nan_policy, kwargs, with ``fixed``
            and ``estimator``.

    Returns:
        What ``curve_fit`` returns.

    Raises:
        ValueError: an unknown estimator, a mask of another shape than (P,), or a
            keyword the Poisson estimator has no place for.
    """
    estimator = checked_estimator(call.pop("estimator"))
    mask = fixed_mask(call["fixed"], 1, options.params)
    if estimator == "poisson":
        return _poisson_fit(options, call)
    if mask is None:
        return None
    call.pop("fixed")
    return _fixed_fit(fit, ~mask[0], options, call)
