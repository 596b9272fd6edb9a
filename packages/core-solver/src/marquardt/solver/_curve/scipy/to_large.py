"""A large torch fit of ``curve_fit`` through the sliced engine, back in SciPy's forms."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..._errors import CovarianceWarning, OptimizeWarning, user_stacklevel
from ..large.fit import curve_fit_result
from .args import numpy_array
from .data import FitData
from .options import FitOptions

__all__ = ["engine_fit"]


def engine_fit(f: Callable[..., Any], data: FitData, options: FitOptions) -> Any:
    """A large torch fit through the sliced engine; results back in SciPy's form.

    The engine reads the same `FitOptions` as the small path: the start and the bounds, the
    loss, the fit tests, and the evaluation budget as its step budget (each LM step
    evaluates f at least once; the engine's own ``max_steps``, when given, wins). A budget
    spent raises SciPy's ``RuntimeError``, as on the small path.

    Arguments:
        f: the model.
        data: its checked data (the engine takes them as given, or without the NaN points).
        options: the checked keywords.

    Returns:
        ``(popt, pcov)``, or with ``full_output`` SciPy's five.
    """
    xdata, ydata = data.given
    sigma = data.sigma
    tests = options.tests
    engine_kw = {"max_steps": tests.max_nfev, **options.engine}
    x = (
        xdata
        if isinstance(xdata, torch.Tensor)
        else torch.as_tensor(np.asarray(xdata, dtype=np.float64))
    )
    y = (
        ydata
        if isinstance(ydata, torch.Tensor)
        else torch.as_tensor(np.asarray(ydata, dtype=np.float64))
    )
    if sigma is not None:
        s = numpy_array(sigma).reshape(-1)
        sigma = np.broadcast_to(s, (y.numel(),)).copy() if s.size == 1 else s
    _warn_if_mixing(f, x, options.start)
    with warnings.catch_warnings():
        # The engine's own warnings say what the SciPy-form results below say again.
        warnings.simplefilter("ignore", OptimizeWarning)
        res = curve_fit_result(
            f,
            x,
            y,
            options.start,
            sigma=sigma,
            absolute_sigma=options.absolute_sigma,
            bounds=(torch.from_numpy(options.lower), torch.from_numpy(options.upper)),
            loss=options.loss,
            f_scale=options.f_scale,
            ftol=tests.ftol,
            xtol=tests.xtol,
            gtol=tests.gtol,
            **engine_kw,
        )
    if not res.success:
        raise RuntimeError(
            "Optimal parameters not found: "
            + res.reason
            + " HINT: raise maxfev / max_steps or start nearer the optimum"
        )
    if bool(torch.isinf(res.pcov).any()):
        warnings.warn(
            "Covariance of the parameters could not be estimated",
            CovarianceWarning,
            stacklevel=user_stacklevel(),
        )
    popt, pcov = data.returned(res.popt, res.pcov)
    if not options.full_output:
        return popt, pcov
    info = {"nfev": res.steps + 1, "fvec": res.residuals.numpy()}
    return popt, pcov, info, res.reason, 1


def _warn_if_mixing(f: Callable[..., Any], x: torch.Tensor, start: np.ndarray) -> None:
    """Warn when f mixes points (``a * x / x.max()``): the engine evaluates f on slices, so
    f(x[:k]) must equal f(x)[:k]."""
    k = min(16, int(x.shape[-1]) // 2)
    if k < 1:
        return
    p = [torch.tensor(float(v), dtype=x.dtype, device=x.device) for v in start]
    with torch.no_grad():
        whole = f(x, *p).reshape(-1)[:k]
        part = f(x[..., :k], *p).reshape(-1)
    if part.shape == whole.shape and not torch.allclose(part, whole, rtol=1e-10, atol=0.0):
        warnings.warn(
            "curve_fit: f(x[:k]) differs from f(x)[:k], so f mixes data points (e.g. "
            "x / x.max()); the sliced engine evaluates f on slices of the data, which changes "
            "such a model. HINT: compute data-wide constants once outside f, or fit on the "
            "small path (fewer points, no device/slice_size keywords)",
            OptimizeWarning,
            stacklevel=user_stacklevel(),
        )
