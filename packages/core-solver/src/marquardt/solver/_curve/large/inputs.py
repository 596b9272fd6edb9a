"""The arguments of ``curve_fit``, checked before any work: `check_curve_inputs`.

A fit minimises ½ Σᵢ c²ρ(((f(xᵢ, p) − yᵢ)/σᵢ / c)²) over p in [lower, upper] (see
``_curve.large.fit``). Here the data are turned into tensors of the fit's dtype on its device,
samples first, and every shape, value and bound is checked; ``f`` is called once on the
first samples at ``p0`` to check what it returns. Every failure raises
`CurveFitInputError` in the house form (what was asked, what was found, HINT), and
nothing has been fitted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..._errors import CurveFitInputError, message
from ..._lm.robust import ROBUST_LOSSES, loss_refusal
from ..bounds_rule import misordered

__all__ = ["PROBE_SAMPLES", "CurveInputs", "check_curve_inputs"]

#: How many samples ``f`` is first called on, at ``p0``, to check its output.
PROBE_SAMPLES = 16


@dataclass(frozen=True)
class CurveInputs:
    """The checked data: ``x`` with samples along dim 0, ``targets`` (N × 2: y and 1/σ; N × 1 without σ),
    ``p0``, ``lower`` and ``upper`` (P, float64 on the CPU), and the device and dtype."""

    x: torch.Tensor
    targets: torch.Tensor
    p0: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    device: torch.device
    dtype: torch.dtype
    samples_last: bool

    @property
    def samples(self) -> int:
        return int(self.targets.shape[0])


def _fail(asked: str, found: str, hint: str) -> CurveFitInputError:
    return CurveFitInputError(message(f"curve_fit {asked}", found, hint))


def _tensor(name: str, value: object, dtype: torch.dtype) -> torch.Tensor:
    try:
        if isinstance(value, torch.Tensor):
            return value.detach().to(dtype)
        return torch.as_tensor(np.asarray(value, dtype=np.float64)).to(dtype)
    except (TypeError, ValueError, RuntimeError) as err:
        raise _fail(
            f"expects {name} as an array of numbers",
            f"converting {type(value).__name__} failed ({err})",
            f"pass {name} as a torch.Tensor or a NumPy array",
        ) from err


def _finite(name: str, t: torch.Tensor) -> None:
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        raise _fail(
            f"expects finite {name}",
            f"{name} contain {bad} NaN/inf values",
            f"drop or fill the non-finite points before fitting, e.g. {name}[mask]",
        )


def _device(device: object, xdata: object) -> torch.device:
    if device is not None:
        try:
            if not isinstance(device, (str, torch.device)):
                raise TypeError(type(device).__name__)
            return torch.device(device)
        except (TypeError, RuntimeError) as err:
            raise _fail(
                "expects device as a torch.device or a name",
                f"got {device!r}",
                "pass device='cpu' or device='cuda:0'",
            ) from err
    if isinstance(xdata, torch.Tensor):
        return xdata.device
    return torch.device("cpu")


def _p0(p0: object, f: Callable[..., Any]) -> torch.Tensor:
    if p0 is None:
        try:
            count = len(inspect.signature(f).parameters) - 1
        except (TypeError, ValueError):
            count = 0
        if count < 1:
            raise _fail(
                "was not given p0",
                "the number of parameters cannot be read from f's signature",
                "pass p0, one starting value per parameter",
            )
        return torch.ones(count, dtype=torch.float64)
    given = _tensor("p0", p0, torch.float64).cpu()
    if given.numel() == 0 or given.dim() > 1:
        raise _fail(
            "expects p0 as a non-empty 1-D sequence of starting values",
            f"got shape {tuple(given.shape)}",
            "pass e.g. p0=[1.0, 0.5, 0.0]",
        )
    start = given.reshape(-1)
    _finite("p0", start)
    return start


def _bounds(bounds: object, p0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    params = p0.numel()
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise _fail(
            "expects bounds as a pair (lower, upper)",
            f"got {bounds!r}",
            "pass bounds=(lower, upper), each a number or one value per parameter",
        )
    sides = []
    for name, side in zip(("lower", "upper"), bounds, strict=True):
        t = _tensor(f"the {name} bound", side, torch.float64).cpu().reshape(-1)
        if t.numel() == 1:
            t = t.expand(params).clone()
        if t.numel() != params:
            raise _fail(
                f"expects the {name} bound as one number or {params} values (one per parameter)",
                f"got {t.numel()} values",
                "pass -np.inf / np.inf for parameters without a bound",
            )
        sides.append(t)
    lower, upper = sides
    bad = misordered(lower, upper)
    if bad:
        raise _fail(
            "expects every lower bound strictly below its upper bound, neither NaN",
            f"lower ≥ upper for parameter(s) {bad} "
            f"(or NaN: lower {lower[bad].tolist()}, upper {upper[bad].tolist()})",
            "swap the bounds, use -np.inf / np.inf for no bound, or fix a parameter by "
            "leaving it out of f",
        )
    outside = ((p0 < lower) | (p0 > upper)).nonzero().flatten().tolist()
    if outside:
        raise _fail(
            "expects p0 within the bounds",
            f"p0 is outside them for parameter(s) {outside}: p0 {p0[outside].tolist()}, "
            f"lower {lower[outside].tolist()}, upper {upper[outside].tolist()}",
            "start from a feasible point, e.g. the middle of each bounded range",
        )
    return lower, upper


def _layout(x: torch.Tensor, samples: int) -> tuple[torch.Tensor, bool]:
    """x with samples first, and whether f expects them along the last axis."""
    if x.dim() == 0:
        raise _fail(
            "expects xdata with one entry (or column) per data point",
            "xdata is a scalar",
            "pass xdata of shape (N,) or (k, N)",
        )
    if x.shape[-1] != samples:
        raise _fail(
            f"expects xdata of shape (N,) or (k, N) with N = {samples} (the length of ydata)",
            f"xdata has shape {tuple(x.shape)}",
            "put the data points along the last axis of xdata (e.g. pass x.T), as "
            "scipy.optimize.curve_fit does",
        )
    if x.dim() == 1:
        return x, False
    return x.movedim(-1, 0).contiguous(), True


def _check_loss(loss: object, f_scale: object) -> float:
    refused = loss_refusal(loss, f_scale)
    if refused == "loss":
        raise _fail(
            f"was given loss={loss!r}",
            f"the known losses are {ROBUST_LOSSES}",
            "use 'linear' (least squares) or a robust loss such as 'soft_l1'",
        )
    if refused == "f_scale" or not isinstance(f_scale, (int, float)):
        raise _fail(
            "expects f_scale > 0 and finite, a number",
            f"got {f_scale!r}",
            "pass the residual size beyond which a point counts as an outlier, e.g. 0.1",
        )
    return float(f_scale)


def check_curve_inputs(
    f: object,
    xdata: object,
    ydata: object,
    p0: object,
    *,
    sigma: object,
    bounds: object,
    robust: tuple[object, object],
    placement: tuple[object, object],
) -> tuple[CurveInputs, float]:
    """The checked data and the checked ``f_scale``; raises before any work.

    Arguments:
        f, xdata, ydata, p0, sigma, bounds: `curve_fit_result`'s.
        robust: its ``loss`` and ``f_scale``.
        placement: its ``device`` and ``dtype``.

    Returns:
        The data as the engine takes them, and the checked ``f_scale``.
    """
    loss, f_scale = robust
    device, dtype = placement
    if not callable(f):
        raise _fail(
            "expects f as a callable f(x, *params)",
            f"got {type(f).__name__}",
            "write the model with torch operations, e.g. lambda x, a, b: a * torch.exp(-b * x)",
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise _fail(
            "expects dtype as a floating torch.dtype",
            f"got {dtype!r}",
            "pass torch.float64 (or torch.float32)",
        )
    scale = _check_loss(loss, f_scale)
    dev = _device(device, xdata)
    y = _tensor("ydata", ydata, dtype)
    if y.dim() != 1 or y.numel() == 0:
        raise _fail(
            "expects ydata as a non-empty 1-D array (one value per data point)",
            f"ydata has shape {tuple(y.shape)}",
            "flatten ydata (y.reshape(-1)) and make f return a matching 1-D tensor",
        )
    samples = int(y.numel())
    x, samples_last = _layout(_tensor("xdata", xdata, dtype), samples)
    _finite("xdata", x)
    _finite("ydata", y)
    weights = None if sigma is None else _weights(sigma, samples, dtype)
    start = _p0(p0, f)
    lower, upper = _bounds(bounds, start)
    # Without σ the targets are y alone (N × 1): the residual reads one contiguous column.
    targets = y.unsqueeze(1) if weights is None else torch.stack([y, weights], dim=1)
    inputs = CurveInputs(
        x=x.to(dev),
        targets=targets.to(dev),
        p0=start,
        lower=lower,
        upper=upper,
        device=dev,
        dtype=dtype,
        samples_last=samples_last,
    )
    _probe(f, inputs)
    return inputs, scale


def _weights(sigma: object, samples: int, dtype: torch.dtype) -> torch.Tensor:
    """1/σ for the checked standard deviations σ, one per point."""
    s = _tensor("sigma", sigma, dtype)
    if s.dim() != 1 or s.numel() != samples:
        raise _fail(
            f"expects sigma as a 1-D array of {samples} standard deviations",
            f"sigma has shape {tuple(s.shape)}",
            "pass one σ per point; for a full covariance matrix, whiten the data "
            "first (solve with its Cholesky factor) and fit without sigma",
        )
    _finite("sigma", s)
    if bool((s <= 0).any()):
        raise _fail(
            "expects sigma > 0",
            f"{int((s <= 0).sum())} entries are ≤ 0",
            "drop the points with no uncertainty estimate, or give them a positive σ",
        )
    return 1.0 / s


def _probe(f: Callable[..., Any], inputs: CurveInputs) -> None:
    """Call f on the first samples at p0 (parameters that carry gradients, as LM's do) and
    check it returns one finite value each; a NumPy model is refused here, before any work."""
    b = min(inputs.samples, PROBE_SAMPLES)
    xs = inputs.x[:b]
    xs = xs.movedim(0, -1) if inputs.samples_last else xs
    start = inputs.p0.to(inputs.device, inputs.dtype)
    params = [start[i].detach().clone().requires_grad_() for i in range(start.numel())]
    try:
        with torch.enable_grad():
            out = f(xs, *params)
    except Exception as err:
        if _runs_without_gradients(f, xs, params):
            raise _fail(
                "differentiates f by autodiff (f is evaluated on torch tensors, in slices)",
                f"f ran on plain tensors and failed once its parameters carried gradients "
                f"({type(err).__name__}: {err}): it is written with NumPy",
                "fit a NumPy model with curve_fit(f, x, y, p0, full_output=True), which "
                "differentiates it numerically; or write f with torch operations "
                "(torch.exp, not np.exp) for curve_fit_result",
            ) from err
        raise _fail(
            f"called f(x, *p0) with {len(params)} parameters on the first {b} points",
            f"it raised {type(err).__name__}: {err}",
            "check that p0 has one value per parameter of f and that f uses torch operations",
        ) from err
    out = out.detach() if isinstance(out, torch.Tensor) else out
    if not isinstance(out, torch.Tensor):
        raise _fail(
            "expects f to return a torch.Tensor",
            f"f returned {type(out).__name__}",
            "write f with torch operations (torch.exp, not np.exp)",
        )
    if tuple(out.shape) != (b,):
        raise _fail(
            f"expects f(x, *p) to return one value per data point, shape ({b},) for {b} points",
            f"f returned shape {tuple(out.shape)}",
            "return a 1-D tensor matching ydata; f must act on each point on its own, "
            "since it is evaluated in slices",
        )
    if not bool(torch.isfinite(out).all()):
        raise _fail(
            "expects f(x, *p0) to be finite",
            f"f returned NaN/inf at p0 on the first {b} points",
            "start from a p0 where the model is defined",
        )


def _runs_without_gradients(f: Callable[..., Any], xs: torch.Tensor, params: list[Any]) -> bool:
    """Whether f(xs, *params) runs once the parameters carry no gradients."""
    try:
        with torch.no_grad():
            f(xs, *(p.detach() for p in params))
    except Exception:
        return False
    return True
