"""The small path of `curve_fit`: SciPy's translated arguments, one fit by the single-fit
driver of ``_curve.single_lm`` with ``kind``'s provider of J, and the result in SciPy's forms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import torch

from ..single_lm.driver import Problem, SmallFit, solve_small
from ..single_lm.minpack import solve_lm
from .args import not_found
from .covariance import columns_dependent, leastsq_info
from .covariance import pcov as scipy_pcov
from .data import FitData
from .options import FitOptions
from .providers import DifferenceProvider, Differences, TorchProvider, Whitening

__all__ = ["small_fit"]


def small_fit(
    f: Callable[..., Any],
    data: FitData,
    options: FitOptions,
    kind: str,
    untracked: list[int],
    first: np.ndarray | None = None,
) -> Any:
    """The fit on the small path (``_curve.single_lm.driver``) with ``kind``'s provider of J.

    A torch model's steps take SciPy's finite differences (``jac``'s scheme, 2-point by
    default) and J at p̂, for pcov, is autodiff's: P + 1 plain evaluations of f cost several
    times less than one autodiff Jacobian on the CPU (benchmarks/NOTES.md, single small fits).

    Arguments:
        f: the model.
        data: its checked data.
        options: the checked keywords.
        kind: ``"torch"`` or ``"numpy"`` (`model_kind`'s).
        untracked: the parameters autodiff does not see (a torch model's).
        first: autodiff's J at the start, when `model_kind` formed it.

    Returns:
        ``(popt, pcov)``, or with ``full_output`` SciPy's five.
    """
    x, y, whitening = data.x, data.y, data.weights
    start, lower, upper, jac = options.start, options.lower, options.upper, options.jac
    n = start.size
    differences = Differences(
        lower,
        upper,
        scheme=jac if isinstance(jac, str) else "2-point",
        diff_step=options.diff_step,
        jac=jac if callable(jac) else None,
    )
    if kind == "torch":
        provider: Any = TorchProvider(
            f, x, y, whitening, differences, first=None if first is None else (start, first)
        )
        if untracked and jac is None:  # a named scheme or jac never differentiates by autodiff
            _refuse_untracked(x, y, whitening, provider, start, lower, upper, untracked)
    else:
        provider = DifferenceProvider(f, x, y, whitening, differences)
    problem = Problem(provider, start, lower, upper, options.tests)
    fit = _solver(options)(problem, x_scale=options.x_scale)
    if fit.status == 0:
        raise not_found(fit.message, options.tests.max_nfev)
    final = fit.jacobian
    if isinstance(provider, TorchProvider) and jac is None and options.loss == "linear":
        # The steps used differences; pcov is autodiff's J at p̂, unless that J's columns are
        # dependent beyond what a float64 covariance can hold: then SciPy's J, as SciPy has.
        exact = provider.exact_jacobian(fit.params)
        if not columns_dependent(exact):
            fit = _polished(provider, fit, exact, options)
            final = fit.jacobian
    pcov = scipy_pcov(
        final, 2.0 * fit.cost, fit.residuals.size, n, options.absolute_sigma, options.method
    )
    result = data.returned(fit.params, pcov)
    if not options.full_output:
        return result
    info: dict[str, Any] = {"nfev": fit.evaluations, "njev": fit.jacobians, "fvec": fit.residuals}
    if options.method == "lm":
        info.update(leastsq_info(final, fit.residuals))
    return (*result, info, fit.message, fit.status)


def _solver(options: FitOptions) -> Callable[..., SmallFit]:
    """MINPACK's ``lmder`` for SciPy's ``"lm"`` (``_curve.single_lm.minpack``), the path
    ``curve_fit_batch`` shares for ``"trf"`` and ``"dogbox"`` (``_curve.single_lm.driver``)."""
    if options.method == "lm" and options.loss == "linear":
        return solve_lm
    return partial(solve_small, loss=options.loss, f_scale=options.f_scale)


class _Exact:
    """The provider's residuals with autodiff's J (the first one given)."""

    def __init__(self, provider: TorchProvider, first: np.ndarray) -> None:
        self.provider = provider
        self.first: np.ndarray | None = first

    @property
    def evaluations(self) -> int:
        return self.provider.evaluations

    def residuals(self, p: np.ndarray) -> np.ndarray:
        return self.provider.residuals(p)

    def jacobian(self, p: np.ndarray, r: np.ndarray) -> np.ndarray:
        first, self.first = self.first, None
        return first if first is not None else self.provider.exact_jacobian(p)


def _polished(
    provider: TorchProvider, fit: SmallFit, exact: np.ndarray, options: FitOptions
) -> SmallFit:
    """The fit continued from p̂ with autodiff's J until a fit test holds again.

    Steps from finite differences stop where the differenced gradient is flat: its
    stationary point is off the model's by the differences' error times J's conditioning
    (NIST's Hahn1 and MGH10, ``bench_nist``). From there the same LM with the exact J
    (one residual and usually one more J at SciPy's tolerances) ends at the model's
    stationary point; the fit reported is the continued one, which only lowers the cost,
    with both runs' evaluations, and the first run's status when the budget ends it.
    """
    left = options.tests.max_nfev - fit.evaluations
    if left < 2:
        return fit
    again = Problem(
        _Exact(provider, exact),
        fit.params,
        options.lower,
        options.upper,
        replace(options.tests, max_nfev=left),
    )
    more = _solver(options)(again, x_scale=options.x_scale)
    return replace(
        more,
        evaluations=fit.evaluations + more.evaluations,
        jacobians=fit.jacobians + more.jacobians,
        steps=fit.steps + more.steps,
        status=more.status or fit.status,
    )


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
        Differences(lower, upper),
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
