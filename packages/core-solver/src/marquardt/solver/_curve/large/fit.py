"""Curve fitting on any device, sliced over the data: `curve_fit_result`.

For data (xᵢ, yᵢ), i = 1…N, standard deviations σᵢ and a model f(x, p) with P parameters,
``curve_fit_result`` finds

    p̂ = argmin_{l ≤ p ≤ u}  ½ Σᵢ c²·ρ(zᵢ),   zᵢ = (rᵢ/c)²,   rᵢ = (f(xᵢ, p) − yᵢ)/σᵢ,

(ρ(z) = z for the default ``loss="linear"``: weighted least squares; robust losses in
``_lm.robust``; bounds by MINUIT's change of variables in ``_curve.large.bounds`` with an active set in
``_curve.large.active_set``) and returns p̂ with the covariance s²·(JᵀJ)⁻¹ of ``_lm.covariance``, as
``scipy.optimize.curve_fit`` does.

It is a thin layer over `LMA`: the parameters live in a one-vector ``nn.Module``
(``_curve.large.model``) whose forward is f, residuals carry 1/σ in the targets, and full-batch
LM steps (Marquardt 1963; Nielsen 1999) run until one terminates (MINPACK's ftol / xtol /
gtol, Moré 1978, or λ at its ceiling: no damped step lowers the cost beyond rounding) or
``max_steps`` is reached. A last pass over the data (``_curve.large.point``) gives J at p̂, a
Gauss-Newton correction of the last digits and the covariance. The Jacobian is computed
by forward mode in slices (P is small), on the CPU or a GPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from marquardt.devices._whole import is_whole
from marquardt.jacobian import keeps_grad_mode

from ..._errors import CurveFitInputError, OptimizeWarning, user_stacklevel
from ..._lm.covariance import covariance_from_factor
from ..._lm.report import StepReport
from .active_set import Tolerances, solve
from .inputs import check_curve_inputs
from .point import PointPasses, Polished, polish

__all__ = ["CurveFitResult", "curve_fit_result"]

_INF = float("inf")
#: LM hands over to Gauss-Newton after an accepted step that lowered the cost by at most
#: this, relative, with its quadratic model holding (``_curve.large.active_set``).
HANDOFF = 1e-6


@dataclass(frozen=True)
class CurveFitResult:
    """What ``curve_fit_result`` returns. Tensors are float64 on the CPU.

    Arguments:
        popt: p̂ (P,).
        pcov: its covariance (P × P); all inf when it cannot be estimated.
        perr: √diag(pcov).
        residuals: (f(x, p̂) − y)/σ (N,).
        cost: ½ Σ c²ρ(z) at p̂ (½ Σ r² for the linear loss).
        jacobian_rank: the rank of J at p̂ (of the rows the covariance uses).
        singular_values: J's singular values at p̂ (of the same rows).
        steps: the LM steps taken.
        success: whether the solver terminated rather than running out of steps.
        termination: one of ``StepReport``'s reasons, ``"gauss-newton"`` when
            Gauss-Newton steps finished the fit, or ``None``.
        reason: ``termination`` as a sentence.
        report: the last step's report (``None`` when no step ran).
    """

    popt: torch.Tensor
    pcov: torch.Tensor
    perr: torch.Tensor
    residuals: torch.Tensor
    cost: float
    jacobian_rank: int
    singular_values: torch.Tensor
    steps: int
    success: bool
    termination: str | None
    reason: str
    report: StepReport | None


@keeps_grad_mode
def curve_fit_result(
    f: Callable[..., torch.Tensor],
    xdata: Any,
    ydata: Any,
    p0: Any = None,
    *,
    sigma: Any = None,
    absolute_sigma: bool = False,
    bounds: tuple[Any, Any] = (-_INF, _INF),
    loss: str = "linear",
    f_scale: float = 1.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    max_steps: int = 1000,
    ftol: float | None = 1e-15,
    xtol: float | None = 1e-15,
    gtol: float | None = 1e-15,
    slice_size: int | None = None,
    lma_options: Mapping[str, object] | None = None,
) -> CurveFitResult:
    """Fit ``f(x, *p)`` to ``ydata``, sliced over the data, on any device.

    The sliced engine under `curve_fit` for large torch fits and GPUs, with its own
    keywords and a richer result; ``curve_fit`` is SciPy's interface. Steps stop when LM
    terminates (MINPACK's tests, or no further decrease beyond rounding) or after
    ``max_steps`` (an `OptimizeWarning`; the result says so in ``success``). A covariance
    that cannot be estimated (J of rank < P, or N ≤ P without ``absolute_sigma``) is all
    inf, with a ``CovarianceWarning``.

    A NumPy model (``np.exp`` on the parameters) is refused before any work, with a HINT:
    the engine differentiates f by autodiff on slices of the data, on any device, which
    needs torch operations; ``curve_fit`` fits NumPy models (``full_output=True`` gives its
    evaluations, residuals and status).

    Arguments:
        f: the model ``f(x, *p)``, written with torch operations; it must treat each data
            point on its own (it is evaluated on slices of the data).
        xdata: the independent variable, (N,) or (k, N).
        ydata: the data, (N,).
        p0: the starting parameters (P,); ``None``: ones, counted from f's signature.
        sigma: the data's standard deviations (N,); ``None``: all 1.
        absolute_sigma: whether ``sigma`` is absolute (as SciPy's); False scales ``pcov``
            by the reduced chi-square.
        bounds: ``(lower, upper)``, numbers or one per parameter; ±inf for none.
        loss: ``"linear"``, ``"soft_l1"``, ``"huber"``, ``"cauchy"`` or ``"arctan"``.
        f_scale: the residual size at which robust losses set in.
        device: where the fit runs; ``None``: where ``xdata`` is, else the CPU.
        dtype: the precision it runs in.
        max_steps: the most LM steps (≥ 1).
        ftol: MINPACK's relative reduction test (``None``: off).
        xtol: MINPACK's relative step test (``None``: off).
        gtol: MINPACK's orthogonality test (``None``: off).
        slice_size: the data points per slice; ``None``: as the planner sees fit.
        lma_options: ``LMA`` keywords for its LM runs, over those chosen on the NIST
            problems (``damping_min``, ``scaling_memory``, ``geodesic``, ``geodesic_after``).

    Returns:
        The `CurveFitResult`: popt, pcov, rank, singular values, steps, report. Its arrays
        are ``torch.Tensor`` of dtype float64 on the CPU whatever the input: NumPy arrays
        and lists in, tensors out (``.numpy()`` gives NumPy's); torch tensors in, on any
        device and in any ``dtype``, float64 CPU tensors out (``.to(x.device)`` moves them
        back). ``cost`` is a Python float, ``steps`` and ``jacobian_rank`` Python ints.

    Raises:
        CurveFitInputError: bad input, before any work (a NumPy model among it).
    """
    if not is_whole(max_steps, 1):
        raise CurveFitInputError(
            f"curve_fit expects max_steps as an integer ≥ 1, but got {max_steps!r}. "
            "HINT: pass e.g. max_steps=1000"
        )
    data, scale = check_curve_inputs(
        f,
        xdata,
        ydata,
        p0,
        sigma=sigma,
        bounds=bounds,
        robust=(loss, f_scale),
        placement=(device, dtype),
    )
    limits = Tolerances(ftol=ftol, xtol=xtol, gtol=gtol, max_steps=max_steps, handoff=HANDOFF)
    passes = PointPasses(f, data, loss=loss, f_scale=scale, slice_size=slice_size)
    tried: list[Polished] = []

    def finish(params: torch.Tensor, free: torch.Tensor) -> bool:
        tried.append(polish(passes, params, data.lower, data.upper, free, handing_over=True))
        return tried[-1].finished

    solved = solve(
        f,
        data,
        limits=limits,
        passes=passes,
        finish=finish,
        lma_options=lma_options,
    )
    done = (
        tried[-1]
        if solved.handed_off
        else polish(passes, solved.params, data.lower, data.upper, solved.free)
    )
    point, final = done.point, done.final
    report = solved.report
    if not solved.terminated:
        warnings.warn(
            f"curve_fit stopped after max_steps={max_steps} LM steps without meeting a "
            "stopping test; the parameters may not be optimal. HINT: raise max_steps or "
            "start nearer the optimum",
            OptimizeWarning,
            stacklevel=user_stacklevel(),
        )
    termination, reason = _termination(solved.handed_off, report)
    popt = final.params
    cov = covariance_from_factor(
        point.factor, point.rows, 2.0 * final.cost, absolute_sigma=absolute_sigma
    )
    return CurveFitResult(
        popt=popt,
        pcov=cov.pcov,
        perr=cov.standard_errors,
        residuals=final.residuals,
        cost=final.cost,
        jacobian_rank=cov.rank,
        singular_values=cov.singular_values,
        steps=solved.steps,
        success=solved.terminated,
        termination=termination,
        reason=reason,
        report=report,
    )


def _termination(handed_off: bool, report: StepReport | None) -> tuple[str | None, str]:
    """The name of the test that ended the fit and its reason."""
    if handed_off:
        return "gauss-newton", (
            f"LM's last step lowered the cost by at most {HANDOFF:g} relative with its "
            "quadratic model holding; Gauss-Newton steps from J's QR factor finished the "
            "fit to rounding"
        )
    if report is None:
        return None, ""
    return report.termination, report.reason
