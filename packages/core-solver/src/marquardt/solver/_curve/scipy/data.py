"""``curve_fit``'s data, checked as SciPy checks them and held in one `FitData` that every
path reads: x as f takes it, y as float64, the whitening, and the form of the results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .args import hinted, numpy_array, omit_nan, refuse_non_finite, whitening
from .options import FitOptions
from .providers import Whitening

__all__ = ["FitData", "fit_data"]


@dataclass(frozen=True)
class FitData:
    """One fit's data, checked.

    Arguments:
        x: xdata as f takes it (float64 NumPy for arrays and tensors).
        y: ydata, (N,) float64.
        weights: the whitening of the residuals (1/σ, or a covariance's factor).
        sigma: the caller's sigma, without the NaN points' rows.
        given: xdata and ydata as the caller gave them, or as ``x`` and ``y`` where NaN
            points were dropped (the sliced engine takes them so).
        torch_out: whether the results are torch tensors.
        device: their device (that of the torch input), or None.
    """

    x: Any
    y: np.ndarray
    weights: Whitening
    sigma: Any
    given: tuple[Any, Any]
    torch_out: bool
    device: torch.device | None

    @property
    def on_device(self) -> bool:
        """Whether the torch input lies on a device other than the CPU."""
        return self.device is not None and self.device.type != "cpu"

    def returned(self, *values: np.ndarray | torch.Tensor) -> tuple[Any, ...]:
        """``values`` in the caller's form.

        Arguments:
            values: arrays of the fit (popt, pcov), NumPy or torch on the CPU.

        Returns:
            Torch tensors on ``device`` for torch input, else NumPy arrays.
        """
        if self.torch_out:
            return tuple(
                (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v))).to(
                    self.device
                )
                for v in values
            )
        return tuple(v.numpy() if isinstance(v, torch.Tensor) else v for v in values)


def fit_data(
    xdata: Any, ydata: Any, sigma: Any, options: FitOptions, nan_policy: str | None
) -> FitData:
    """``curve_fit``'s data checked with SciPy's errors (non-finite values, ``nan_policy``,
    no points, more parameters than points for ``"lm"``, sigma's shape and values).

    Arguments:
        xdata, ydata, sigma, nan_policy: `curve_fit`'s.
        options: its checked keywords.

    Returns:
        The data every path reads.
    """
    device = _device(xdata, ydata)
    y = numpy_array(ydata).reshape(-1) if numpy_array(ydata).ndim else numpy_array(ydata).reshape(1)
    x = xdata
    if isinstance(xdata, (list, tuple, np.ndarray)):
        x = np.asarray(xdata, dtype=np.float64)
    elif isinstance(xdata, torch.Tensor):
        x = xdata.detach().cpu().to(torch.float64).numpy()
    if options.check_finite:
        refuse_non_finite("ydata", y)
        if isinstance(x, np.ndarray):
            refuse_non_finite("xdata", x)
    if y.size == 0:
        raise hinted(ValueError, "`ydata` must not be empty!", "pass at least one data point")
    given = (xdata, ydata)
    if not options.check_finite and nan_policy is not None and _has_nan(x, y, nan_policy):
        x, y, sigma = omit_nan(x, y, sigma)
        given = (x, y)
    n = options.params
    if options.method == "lm" and y.size != 1 and n > y.size:
        raise hinted(
            TypeError,
            f"The number of func parameters={n} must not exceed the number of data points={y.size}",
            "fit fewer parameters or give more points",
        )
    torch_out = isinstance(ydata, torch.Tensor) or isinstance(xdata, torch.Tensor)
    return FitData(x, y, whitening(sigma, y.size), sigma, given, torch_out, device)


def _device(xdata: Any, ydata: Any) -> torch.device | None:
    """The device of the torch input (ydata's first), or None."""
    if isinstance(ydata, torch.Tensor):
        return ydata.device
    return xdata.device if isinstance(xdata, torch.Tensor) else None


def _has_nan(x: Any, y: np.ndarray, nan_policy: str) -> bool:
    """Whether the data hold NaN points to drop (``"omit"``); refuses ``"propagate"``, and
    NaN points under ``"raise"``."""
    if nan_policy == "propagate":
        raise hinted(
            ValueError,
            "`nan_policy='propagate'` is not supported by this function.",
            "use nan_policy='omit' to drop the NaN points, or 'raise'",
        )
    has_nan = bool(np.isnan(y).any()) or (isinstance(x, np.ndarray) and bool(np.isnan(x).any()))
    if has_nan and nan_policy == "raise":
        raise hinted(
            ValueError,
            "The input contains nan values",
            "drop them or pass nan_policy='omit'",
        )
    return has_nan
