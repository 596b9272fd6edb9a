"""A large torch fit of ``curve_fit`` through the sliced engine, back in SciPy's forms."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..._errors import CovarianceWarning, OptimizeWarning
from ..large.fit import curve_fit_result
from .args import numpy_array

__all__ = ["ENGINE_KEYWORDS", "engine_fit"]

ENGINE_KEYWORDS = frozenset({"device", "dtype", "slice_size", "max_steps"})


def engine_fit(
    f: Callable[..., Any],
    xdata: Any,
    ydata: Any,
    start: np.ndarray,
    sigma: Any,
    absolute_sigma: bool,
    bounds: tuple[np.ndarray, np.ndarray],
    loss: str,
    f_scale: float,
    full_output: bool,
    torch_out: bool,
    kwargs: dict[str, Any],
) -> Any:
    """A large torch fit through the sliced engine; results back in SciPy's form."""
    engine_kw = {k: kwargs[k] for k in ENGINE_KEYWORDS if k in kwargs}
    if "max_steps" not in engine_kw and ("maxfev" in kwargs or "max_nfev" in kwargs):
        engine_kw["max_steps"] = int(kwargs.get("max_nfev") or kwargs["maxfev"])
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
    _warn_if_mixing(f, x, start)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CovarianceWarning)
        res = curve_fit_result(
            f,
            x,
            y,
            start,
            sigma=sigma,
            absolute_sigma=absolute_sigma,
            bounds=(torch.from_numpy(bounds[0]), torch.from_numpy(bounds[1])),
            loss=loss,
            f_scale=f_scale,
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
            "Covariance of the parameters could not be estimated", CovarianceWarning, stacklevel=3
        )
    device = y.device if isinstance(ydata, torch.Tensor) else x.device
    popt, pcov = (
        (res.popt.to(device), res.pcov.to(device))
        if torch_out
        else (res.popt.numpy(), res.pcov.numpy())
    )
    if not full_output:
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
            stacklevel=4,
        )
