"""The small path of `curve_fit`: SciPy's translated arguments, one fit by the single-fit
driver of ``_curve.small`` with ``kind``'s provider of J, and the result in SciPy's forms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..small.single import solve_small
from .covariance import columns_dependent, pivoted_qr
from .covariance import pcov as scipy_pcov
from .providers import DifferenceProvider, TorchProvider, Whitening

__all__ = ["small_fit"]


def small_fit(
    f: Callable[..., Any],
    x: Any,
    y: np.ndarray,
    start: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    whitening: Whitening,
    jac: Any,
    method: str,
    loss: str,
    f_scale: float,
    scale: np.ndarray | None,
    diff_step: np.ndarray | None,
    maxfev: int,
    tol: dict[str, float],
    absolute_sigma: bool,
    full_output: bool,
    torch_out: bool,
    out_device: Any,
    kind: str,
    untracked: list[int],
    first: np.ndarray | None = None,
) -> Any:
    """The fit on the small path (``_curve.small.single``) with ``kind``'s provider of J."""
    n = start.size
    if kind == "torch":
        provider: Any = TorchProvider(
            f,
            x,
            y,
            whitening,
            differences=(lower, upper),
            scheme=jac if isinstance(jac, str) else "2-point",
            diff_step=diff_step,
            jac=jac if callable(jac) else None,
            first=None if first is None else (start, first),
        )
        if untracked and jac is None:  # a named scheme or jac never differentiates by autodiff
            _refuse_untracked(x, y, whitening, provider, start, lower, upper, untracked)
    else:
        provider = DifferenceProvider(
            f,
            x,
            y,
            whitening,
            scheme=jac if isinstance(jac, str) else "2-point",
            diff_step=diff_step,
            jac=jac if callable(jac) else None,
            lower=lower,
            upper=upper,
        )
    fit = solve_small(
        provider,
        start,
        lower,
        upper,
        max_nfev=int(maxfev),
        x_scale=scale,
        loss=loss,
        f_scale=f_scale,
        **tol,
    )
    if fit.status == 0:
        raise RuntimeError(
            "Optimal parameters not found: "
            + fit.message
            + f" HINT: raise maxfev (it was {maxfev}) or start nearer the optimum"
        )
    final = fit.jacobian
    if isinstance(provider, TorchProvider) and jac is None and loss == "linear":
        # The steps used differences; pcov is autodiff's J at p̂, unless that J's columns are
        # dependent beyond what a float64 covariance can hold: then SciPy's J, as SciPy has.
        exact = provider.exact_jacobian(fit.params)
        final = final if columns_dependent(exact) else exact
    pcov = scipy_pcov(final, 2.0 * fit.cost, fit.residuals.size, n, absolute_sigma, method)
    popt = fit.params
    if torch_out:
        popt_t = torch.from_numpy(popt.copy()).to(out_device)
        pcov_t = torch.from_numpy(pcov).to(out_device)
        result: tuple[Any, ...] = (popt_t, pcov_t)
    else:
        result = (popt, pcov)
    if not full_output:
        return result
    info: dict[str, Any] = {"nfev": fit.evaluations, "njev": fit.jacobians, "fvec": fit.residuals}
    if method == "lm":  # leastsq's factor of J at p̂: R (transposed), pivots, Qᵀr
        q, r, piv = pivoted_qr(final)
        info.update(fjac=r.T, ipvt=piv + 1, qtf=q.T @ fit.residuals)
    return (*result, info, fit.message, fit.status)


def _refuse_untracked(
    x: Any,
    y: np.ndarray,
    whitening: Whitening,
    provider: TorchProvider,
    p: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    dead: list[int],
) -> None:
    """Refuse a torch model that turned a parameter into a Python number (``math.exp(b)``):
    autodiff sees no dependence where finite differences do."""
    r = provider.residuals(p)
    numeric = DifferenceProvider(
        lambda xx, *q: provider._call(torch.tensor(q, dtype=torch.float64)).detach().numpy(),
        x,
        y,
        whitening,
        lower=lower,
        upper=upper,
    )
    fd = numeric.jacobian(p, r)
    untracked = [k for k in dead if np.max(np.abs(fd[:, k])) > 0]
    if untracked:
        raise ValueError(
            f"curve_fit differentiates f by autodiff, but f's output does not depend on "
            f"parameter(s) {untracked} under autodiff while finite differences say it does: "
            "f turns them into Python numbers (float(p), math.exp(p), p.item()). HINT: use "
            "torch operations on the parameters (torch.exp(b)), or write f with NumPy "
            "throughout so it is differentiated numerically"
        )
