"""``curve_fit`` with ``scipy.optimize.curve_fit``'s signature, meanings, errors and returns.

SciPy's arguments are translated here, once, into the fit's own terms: the model kind
(torch → autodiff; anything else → SciPy's finite differences, ``_curve.scipy.providers``), the
whitening W (1/σ, or L⁻¹ for a covariance matrix σ = LLᵀ), the bounds and SciPy's feasible
start, the stopping tolerances and evaluation budget, and the path: the small-fit LM of
``_curve.single_lm.driver`` (every NumPy model, every torch model of up to ``SMALL_POINTS`` points
with its data on the CPU) or the sliced engine of ``_curve.large.fit`` (larger torch fits, torch
data on a GPU, or the engine's keywords). The results go
back in SciPy's form: NumPy float64 for NumPy input, torch on the data's device for torch
input; SciPy's exceptions (``ValueError``, ``TypeError``, ``RuntimeError("Optimal
parameters not found: ...")``) and ``OptimizeWarning``; pcov from the pseudo-inverse of J
as ``least_squares``' branch of SciPy computes it.

``method``: "lm" (the default without bounds) runs MINPACK's trust-region LM and its tests
(``_curve.single_lm.minpack``); "trf" and "dogbox" run LM with projected bounds and
``least_squares``' tests (``_curve.single_lm.driver``, the steps ``curve_fit_batch`` takes);
each with SciPy's checks ("lm" refuses bounds) and SciPy's default evaluation budget for
the named method. A torch model's fit, stepped with SciPy's differences, goes on from p̂
with autodiff's J until a test holds again (``_curve.scipy.to_single``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np

from marquardt.jacobian import keeps_grad_mode

from .._backends.blas_threads import one_blas_thread
from .batch_of_one import compiled_fit, serves
from .compiled_lm import check_compile
from .gpufit_keywords import gpufit_fit
from .scipy.args import hinted
from .scipy.data import FitData, fit_data
from .scipy.options import ENGINE_KEYWORDS, SCIPY_KEYWORDS, FitOptions, fit_options
from .scipy.providers import model_kind
from .scipy.to_large import engine_fit
from .scipy.to_single import small_fit
from .threads import choose_threads, torch_threads

__all__ = ["BLAS_POINTS", "ENGINE_ONE_THREAD_POINTS", "SMALL_POINTS", "curve_fit"]

#: Torch models with at most this many points (data on the CPU) take the small-fit path;
#: larger ones the sliced engine, which bounds memory, runs on GPUs and is faster there
#: (the crossover between 10⁴ and 10⁵ points: ``bench_curve_fit``, ``bench_small_fit``).
SMALL_POINTS = 50_000
#: Below this many points the sliced engine runs with one torch thread: its kernels are
#: short, and two threads on busy cores made a fit many times slower (benchmarks/NOTES.md,
#: single small fits). From it on, as many as ``threads.choose_threads`` finds idle cores
#: for.
ENGINE_ONE_THREAD_POINTS = 1_000_000
#: From this many points a small fit also limits NumPy's BLAS to one thread (setting the
#: limit costs more than a fit of fewer points).
BLAS_POINTS = 10_000


def takes_engine(
    kind: str, points: int, on_device: bool, options: FitOptions, covariance: bool
) -> bool:
    """Whether a fit runs on the sliced engine: a torch model with more than
    ``SMALL_POINTS`` points, data on a GPU or the engine's keywords, unless it asks for
    what only the small path has (a J other than autodiff's, fixed scales, a covariance
    matrix as sigma)."""
    wanted = bool(options.engine) or points > SMALL_POINTS or on_device
    return kind == "torch" and wanted and not options.differences and not covariance


def takes_compiled(
    mode: str | bool, on_device: bool, options: FitOptions, untracked: list[int]
) -> bool:
    """Whether a torch model's fit may run through the compiled core (``_curve.batch_of_one``):
    ``compile`` allows it, the data are on the CPU, no engine keyword or J other than
    autodiff's is asked for, and autodiff sees every parameter."""
    return (
        mode is not False
        and not on_device
        and not options.engine
        and not options.differences
        and not untracked
    )


@keeps_grad_mode
def curve_fit(
    f: Callable[..., Any],
    xdata: Any,
    ydata: Any,
    p0: Any = None,
    sigma: Any = None,
    absolute_sigma: bool = False,
    check_finite: bool | None = None,
    bounds: Any = (-np.inf, np.inf),
    method: str | None = None,
    jac: Callable[..., Any] | str | None = None,
    *,
    full_output: bool = False,
    nan_policy: str | None = None,
    compile: str | bool = "auto",
    fixed: Any = None,
    estimator: str = "lse",
    **kwargs: Any,
) -> Any:
    """Fit ``f(xdata, *p)`` to ``ydata`` as ``scipy.optimize.curve_fit`` does.

    Every argument means what it means in SciPy 1.17 (docs/curve-fitting.md#coming-from-scipy
    lists what differs); all fits run one algorithm, LM with bounds. The richer result
    (rank, singular values, steps, report) is `curve_fit_result`'s.

    Arguments:
        f: the model ``f(xdata, *p)``, one value per data point: written with NumPy (J by
            SciPy's finite differences, or ``jac``) or with torch (evaluated on tensors;
            J at p̂ by autodiff unless ``jac`` is given).
        xdata: the independent variable, passed to ``f`` as it is (arrays and tensors as
            float64).
        ydata: the data, (N,).
        p0: the starting parameters; ``None``: ones, or inside the bounds (mid-range,
            ``lb + 1``, ``ub − 1``), counted from f's signature.
        sigma: a number, (N,) standard deviations or an (N, N) covariance; ``None``: all 1.
        absolute_sigma: whether ``sigma`` is absolute; False scales ``pcov`` by the
            reduced chi-square.
        check_finite: refuse NaN/inf in the data; ``None``: True unless ``nan_policy``
            is given.
        bounds: ``(lower, upper)``, numbers or one per parameter (±inf for none), or a
            ``scipy.optimize.Bounds``.
        method: ``"lm"`` (refuses bounds), ``"trf"`` or ``"dogbox"``: all run our LM,
            and pick SciPy's default evaluation budget and pcov formula; ``None``:
            ``"trf"`` with bounds, else ``"lm"``.
        jac: J as a callable ``jac(xdata, *p)``, or a difference scheme ``"2-point"``,
            ``"3-point"`` or ``"cs"``; ``None``: 2-point differences (and autodiff for a
            torch model's J at p̂).
        full_output: also return SciPy's ``infodict``, ``mesg`` and ``ier``.
        nan_policy: with ``check_finite`` off, ``"raise"`` or ``"omit"`` (drops the NaN
            points, and sigma's rows and columns); ``"propagate"`` is refused.
        compile: ``"auto"``, True or False, as in `curve_fit_batch`: a torch model's fit
            runs as a batch of one through its compiled core (``_curve.batch_of_one``:
            f, J, JᵀJ and Jᵀr in one fused pass per iteration) when a kernel for this model
            and these shapes is kept on disk or in this process, or one is to be compiled
            inline (True; ``"auto"`` where the fit repays the compile); else, and for what that
            core does not serve (``jac``, ``diff_step``, numeric ``x_scale``, a covariance
            matrix as ``sigma``, the engine's keywords, data on a GPU), on the paths below.
        fixed: booleans (P,), True for the parameters held at their p0 (Gpufit's
            ``parameters_to_fit``, inverted): the fit of the model with those values
            written in (``_curve.gpufit_keywords``), their rows and columns of pcov zero.
        estimator: ``"lse"`` (least squares, SciPy's) or ``"poisson"``: Gpufit's Poisson
            maximum likelihood for counts, run as `curve_fit_batch` runs it (a torch
            model; no sigma or ``jac``); pcov the inverse Fisher information.
        **kwargs: SciPy's ``maxfev`` / ``max_nfev`` (the evaluation budget), ``ftol``,
            ``xtol``, ``gtol`` (1e-8 each), ``x_scale`` (``"jac"`` or positive numbers),
            ``diff_step``, ``loss``, ``f_scale``, leastsq's ``epsfcn`` (step √epsfcn) and
            ``col_deriv``; ``factor``, ``verbose``, ``tr_solver``, ``tr_options``,
            ``jac_sparsity``, ``lsmr_tol`` and ``max_iter`` have no effect. A torch model
            also takes the engine's ``device``, ``dtype``, ``slice_size`` and
            ``max_steps``, which send it to the sliced engine of `curve_fit_result`. Every
            keyword means the same on both paths; a torch fit that asks for what only the
            small path has (``jac``, ``diff_step``, numeric ``x_scale``, a covariance
            matrix as ``sigma``) runs there at any size.

    Returns:
        ``(popt, pcov)``, or with ``full_output=True`` ``(popt, pcov, infodict, mesg,
        ier)``; NumPy float64 for NumPy input, torch tensors on the data's device for
        torch input.

    Raises:
        ValueError: bad input, with SciPy's message (``args``, a start outside the
            bounds, ``"lm"`` with bounds, NaN/inf data, a torch model that turns a
            parameter into a Python number).
        TypeError: ``f`` not callable, an unknown keyword, or more parameters than
            points with ``"lm"``.
        RuntimeError: ``"Optimal parameters not found: ..."``, out of evaluations.

    Bounds: both paths minimise the same cost over l ≤ p ≤ u and stop at the same
    constrained minimum (the same parameters on their bounds), by different paths. The small
    path (every NumPy model; a torch model of up to ``SMALL_POINTS`` points with its data on
    the CPU) projects each trial point onto the bounds and holds a parameter on a bound
    while its gradient pushes outwards, as SciPy's ``trf`` does. The sliced engine (more
    points, data on a GPU, or the engine's keywords) changes variables, p = φ(q) (MINUIT's
    transform), holds a parameter that reaches a bound and releases it when the first-order
    conditions ask: its steps are `LMA`'s, taken in place on the model's parameters on every
    device, where a projection has no place. Evaluation counts and the last digits differ.
    """
    _refuse_call(f, kwargs)
    mode = check_compile(compile)
    options = fit_options(
        f,
        p0,
        bounds,
        method,
        jac,
        kwargs={
            "absolute_sigma": absolute_sigma,
            "check_finite": check_finite,
            "full_output": full_output,
            "nan_policy": nan_policy,
            **kwargs,
        },
    )
    if fixed is not None or estimator != "lse":
        call = {
            "f": f,
            "xdata": xdata,
            "ydata": ydata,
            "sigma": sigma,
            "absolute_sigma": absolute_sigma,
            "check_finite": check_finite,
            "method": method,
            "jac": jac,
            "full_output": full_output,
            "nan_policy": nan_policy,
            "kwargs": kwargs,
            "fixed": fixed,
            "estimator": estimator,
        }
        done = gpufit_fit(curve_fit, options, call)
        if done is not None:
            return done
    return _routed(f, fit_data(xdata, ydata, sigma, options, nan_policy), options, mode)


def _refuse_call(f: Any, kwargs: dict[str, Any]) -> None:
    """Refuse, as SciPy does, an ``f`` that is not callable, ``args`` and unknown keywords."""
    if not callable(f):
        raise hinted(TypeError, f"f must be callable, got {type(f).__name__}.", "pass f(x, *p)")
    if "args" in kwargs:
        raise hinted(
            ValueError,
            "'args' is not a supported keyword argument.",
            "bind extra arguments into f, e.g. lambda x, a, b: g(x, a, b, extra)",
        )
    unknown = sorted(set(kwargs) - SCIPY_KEYWORDS - ENGINE_KEYWORDS)
    if unknown:
        raise hinted(
            TypeError,
            f"curve_fit() got an unexpected keyword argument {unknown[0]!r}.",
            f"the keywords beyond SciPy's signature are {sorted(SCIPY_KEYWORDS | ENGINE_KEYWORDS)}",
        )


def _routed(f: Callable[..., Any], data: FitData, options: FitOptions, mode: str | bool) -> Any:
    """The fit on its path: the compiled core, the small path or the sliced engine."""
    size = data.y.size
    # One torch thread (and one BLAS thread from BLAS_POINTS points on) for a small fit:
    # its kernels are too short to share, and two pools alternating on busy cores made a
    # fit of 10⁴ points many times slower with torch's default two threads than with one.
    blas = one_blas_thread() if size >= BLAS_POINTS else nullcontext()
    with torch_threads(1), blas:
        kind, _, untracked, first = model_kind(f, data.x, options.start)
    compiled = kind == "torch" and takes_compiled(mode, data.on_device, options, untracked)
    if compiled and serves(data, options):
        fitted = compiled_fit(f, data, options, mode)
        if fitted is not None:
            return fitted
    covariance = data.weights.factor is not None
    with torch_threads(1), blas:
        if not takes_engine(kind, size, data.on_device, options, covariance):
            return small_fit(f, data, options, kind, untracked, first)
    with torch_threads(choose_threads(size, ENGINE_ONE_THREAD_POINTS)):
        return engine_fit(f, data, options)
