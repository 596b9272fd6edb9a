"""``curve_fit_batch``'s arguments, checked and turned into tensors before any work.

Shapes (M fits, N points per fit, P parameters, k input rows):

* ydata (M, N); xdata shared, (N,) or (k, N), or one per fit, (M, N) or (M, k, N) (a 2-D
  xdata whose first axis is M is taken per fit: expand a shared (M, N) one to (M, M, N));
* p0 (P,) or (M, P), or None for SciPy's feasible start with P counted from f's signature;
* bounds: (lower, upper), each a number, (P,) or (M, P); sigma: a number, (N,) or (M, N)
  standard deviations; loss: one name or M names; f_scale: a number or (M,).

``nan_policy="omit"`` drops, per fit, the points whose y, x or σ is NaN (a mask, so fits
keep different numbers of points); otherwise NaN or inf in the data is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..fit_tests import FitTests
from ..scipy.args import (
    bound_sides,
    check_bound_order,
    checked_loss,
    feasible_start,
    hinted,
    parameter_count,
)
from ..scipy.options import fit_tests
from .start import checked_estimator, evaluation_budget, fixed_mask, projected, start_values

__all__ = ["BatchArgs", "BatchKeywords", "batch_args"]


@dataclass(frozen=True)
class BatchArgs:
    """The batch in tensors on ``device`` in ``dtype`` (NaN points zeroed and masked;
    w = 1/σ, None for σ = 1)."""

    x: torch.Tensor
    x_per_fit: bool
    y: torch.Tensor
    w: torch.Tensor | None
    mask: torch.Tensor | None
    p0: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    losses: tuple[str, ...]
    loss_index: torch.Tensor
    f_scale: torch.Tensor
    tests: FitTests
    torch_out: bool
    out_device: torch.device
    free: torch.Tensor | None = None
    estimator: str = "lse"


def _array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.float64).numpy()
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise hinted(
            ValueError, f"`{name}` must be numbers.", f"got {type(value).__name__}"
        ) from err


def _per_fit(name: str, value: Any, fits: int, size: int) -> np.ndarray:
    """``value`` as (fits, size): one number, ``size`` values shared, or one row per fit."""
    a = _array(name, value)
    if a.ndim == 0 or a.shape == (size,) or a.shape == (fits, size):
        return np.broadcast_to(a, (fits, size)).copy()
    raise hinted(
        ValueError,
        f"`{name}` has shape {a.shape}.",
        f"give one number, {size} values shared by every fit, or ({fits}, {size}), one row per fit",
    )


def _tensor(name: str, value: Any, where: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a tensor on ``where`` in ``dtype`` (a tensor stays on its device when
    that is ``where``: data on a GPU is not copied through the host)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(where, dtype)
    return torch.from_numpy(_array(name, value)).to(where, dtype)


def _xdata(x: torch.Tensor, fits: int, points: int) -> bool:
    """Whether x is one input per fit; refuses shapes that fit neither form."""
    if x.ndim == 0 or x.shape[-1] != points or x.ndim > 3:
        raise hinted(
            ValueError,
            f"xdata has shape {tuple(x.shape)}, ydata {(fits, points)}.",
            f"pass xdata as ({points},) or (k, {points}) shared by the fits, or "
            f"({fits}, {points}) or ({fits}, k, {points}), one per fit",
        )
    per_fit = x.ndim == 3 or (x.ndim == 2 and x.shape[0] == fits)
    if x.ndim == 3 and x.shape[0] != fits:
        raise hinted(
            ValueError,
            f"xdata has shape {tuple(x.shape)} for {fits} fits.",
            f"a 3-D xdata is one (k, {points}) input per fit: ({fits}, k, {points})",
        )
    return per_fit


def _sigma(sigma: torch.Tensor, fits: int, points: int) -> torch.Tensor:
    if sigma.ndim == 0 or tuple(sigma.shape) in ((points,), (fits, points)):
        return sigma.expand(fits, points)
    raise hinted(
        ValueError,
        f"`sigma` has shape {tuple(sigma.shape)}.",
        f"give one number, {points} values shared by every fit, or ({fits}, {points}) "
        "standard deviations; covariance matrices are curve_fit's only",
    )


def _losses(loss: Any, fits: int) -> tuple[tuple[str, ...], np.ndarray]:
    names = [loss] if isinstance(loss, str) else list(loss)
    if not isinstance(loss, str) and len(names) != fits:
        raise hinted(
            ValueError,
            f"`loss` has {len(names)} names for {fits} fits.",
            "give one loss name, or one per fit",
        )
    for name in names:
        checked_loss(name, 1.0)
    unique = tuple(sorted(set(names)))
    index = np.array([unique.index(n) for n in names], dtype=np.int64)
    return unique, np.broadcast_to(index, (fits,)).copy()


def _mask(
    x: torch.Tensor,
    per_fit: bool,
    y: torch.Tensor,
    sigma: torch.Tensor | None,
    nan_policy: str | None,
) -> torch.Tensor | None:
    """Points kept per fit (None: all); refuses non-finite data unless ``omit``."""
    bad_x = ~torch.isfinite(x)
    if bad_x.ndim == (3 if per_fit else 2):
        bad_x = bad_x.any(dim=-2)
    bad = ~torch.isfinite(y) | bad_x
    if sigma is not None:
        bad |= ~torch.isfinite(sigma)
    if not bool(bad.any()):
        return None
    if nan_policy != "omit":
        raise hinted(
            ValueError,
            "array must not contain infs or NaNs",
            f"{int(bad.sum())} points hold NaN/inf in ydata, xdata or sigma: drop them, or pass "
            "nan_policy='omit' to leave them out of their fits",
        )
    return ~bad


@dataclass(frozen=True)
class BatchKeywords:
    """``curve_fit_batch``'s keywords beyond the data, the start and the bounds, as the
    caller gave them (`curve_fit_batch` documents each); ``max_nfev`` is SciPy's budget
    (``maxfev`` for ``"lm"``), ``fixed``, ``estimator`` and ``max_iterations`` Gpufit's
    (``_curve.batch.start``)."""

    loss: Any = "linear"
    f_scale: Any = 1.0
    nan_policy: str | None = None
    ftol: float | None = None
    xtol: float | None = None
    gtol: float | None = None
    max_nfev: int | None = None
    device: Any = None
    dtype: torch.dtype | None = None
    fixed: Any = None
    estimator: str = "lse"
    max_iterations: int | None = None


def batch_args(
    f: Any, xdata: Any, ydata: Any, p0: Any, sigma: Any, bounds: Any, given: BatchKeywords
) -> BatchArgs:
    """Every check and conversion of ``curve_fit_batch``'s arguments (module docstring).

    Arguments:
        f, xdata, ydata, p0, sigma, bounds: `curve_fit_batch`'s.
        given: its other keywords.

    Returns:
        The batch in tensors.
    """
    estimator = checked_estimator(given.estimator)
    if not callable(f):
        raise hinted(TypeError, f"f must be callable, got {type(f).__name__}.", "pass f(x, *p)")
    if given.nan_policy not in (None, "raise", "omit"):
        raise hinted(
            ValueError,
            "nan_policy must be one of {None, 'raise', 'omit'}",
            f"got {given.nan_policy!r}",
        )
    tensors = [t for t in (ydata, xdata) if isinstance(t, torch.Tensor)]
    out_device = tensors[0].device if tensors else torch.device("cpu")
    where = torch.device(given.device) if given.device is not None else out_device
    dtype = _dtype_of(ydata) if given.dtype is None else given.dtype
    y = _tensor("ydata", ydata, where, dtype)
    if y.ndim != 2 or y.numel() == 0:
        raise hinted(
            ValueError,
            f"ydata must be (M, N): M fits of N points; got shape {tuple(y.shape)}.",
            "for one fit call curve_fit, or pass ydata[None]",
        )
    fits, points = y.shape
    x = _tensor("xdata", xdata, where, dtype)
    per_fit = _xdata(x, fits, points)
    start, lower, upper = _start_and_bounds(f, p0, bounds, fits)
    free = fixed_mask(given.fixed, fits, start.shape[1])
    if estimator == "poisson":
        _poisson_data(y, sigma, given.loss)
    x, y, s, mask = _masked(x, per_fit, y, sigma, given.nan_policy)
    losses, loss_index = _losses(given.loss, fits)
    scale = _f_scale(given.f_scale, fits)
    checked_loss(losses[0], scale)
    bounded = bool(np.isfinite(lower).any() or np.isfinite(upper).any())
    tests = fit_tests(
        given.ftol,
        given.xtol,
        given.gtol,
        evaluation_budget(given.max_nfev, given.max_iterations),
        method="trf" if bounded else "lm",
        params=start.shape[1],
        dtype=dtype,
    )

    def put(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(where, dtype)

    return BatchArgs(
        x=x,
        x_per_fit=per_fit,
        y=y,
        w=None if s is None else 1.0 / s,
        mask=mask,
        p0=put(start),
        lower=put(lower),
        upper=put(upper),
        losses=losses,
        loss_index=torch.from_numpy(loss_index).to(where),
        f_scale=put(scale),
        tests=tests,
        torch_out=bool(tensors),
        out_device=out_device,
        free=None if free is None else torch.from_numpy(~free).to(where),
        estimator=estimator,
    )


def _masked(
    x: torch.Tensor, per_fit: bool, y: torch.Tensor, sigma: Any, nan_policy: str | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """x, y and σ (M, N) checked, with the mask of the points kept (``nan_policy="omit"``;
    None when every point is), their left-out entries replaced by harmless values."""
    fits, points = y.shape
    s = None if sigma is None else _sigma(_tensor("sigma", sigma, y.device, y.dtype), fits, points)
    if s is not None and bool((s <= 0).any()):
        raise hinted(
            ValueError, "`sigma` must be positive and finite.", "give each point a positive σ"
        )
    mask = _mask(x, per_fit, y, s, nan_policy)
    if mask is not None:
        y = torch.where(mask, y, 0.0)
        s = None if s is None else torch.where(mask, s, 1.0)
        x = torch.where(torch.isfinite(x), x, 0.0)
    return x, y, s, mask


def _f_scale(f_scale: Any, fits: int) -> np.ndarray:
    """The robust loss's scale c, one per fit."""
    scale = _array("f_scale", f_scale).reshape(-1)
    if scale.size not in (1, fits):
        raise hinted(
            ValueError,
            f"`f_scale` has {scale.size} values for {fits} fits.",
            "give one number, or one per fit",
        )
    return np.broadcast_to(scale, (fits,)).copy()


def _start_and_bounds(
    f: Any, p0: Any, bounds: Any, fits: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p0, lower, upper), each (M, P): p0 checked (``start.start_values``) and projected
    into the checked bounds, or SciPy's feasible start with P from f's signature."""
    given = None if p0 is None else start_values(f, p0, fits)
    count = parameter_count(f) if given is None else given.shape[1]
    lb, ub = bound_sides(bounds)
    lower, upper = _per_fit("bounds", lb, fits, count), _per_fit("bounds", ub, fits, count)
    check_bound_order(lower, upper)
    start = feasible_start(lower, upper) if given is None else projected(given, lower, upper)
    return start, lower, upper


def _dtype_of(ydata: Any) -> torch.dtype:
    """The precision of a call without ``dtype``: ydata's when it is floating point (a
    torch tensor, or a NumPy float32 or float64 array: float32 in, float32 out), else
    float64."""
    if isinstance(ydata, torch.Tensor):
        return ydata.dtype if ydata.is_floating_point() else torch.float64
    kind = getattr(ydata, "dtype", None)
    return torch.float32 if kind == np.float32 else torch.float64


def _poisson_data(y: torch.Tensor, sigma: Any, loss: Any) -> None:
    """Refuse what the Poisson estimator has no place for: σ (the counts' variance is the
    model's), a robust loss, and negative counts."""
    if sigma is not None or not (isinstance(loss, str) and loss == "linear"):
        raise hinted(
            ValueError,
            "estimator='poisson' takes neither sigma nor a robust loss.",
            "the Poisson likelihood weighs each count by the model itself: leave sigma and "
            "loss out, or use estimator='lse'",
        )
    if bool((y < 0).any()):
        raise hinted(
            ValueError,
            f"estimator='poisson' fits counts; ydata holds {int((y < 0).sum())} negative values.",
            "subtract no offset from the counts (fit the background instead), or use "
            "estimator='lse'",
        )
