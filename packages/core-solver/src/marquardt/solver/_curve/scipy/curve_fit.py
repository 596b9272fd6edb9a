"""``curve_fit`` with ``scipy.optimize.curve_fit``'s signature, meanings, errors and returns.

SciPy's arguments are translated here, once, into the fit's own terms: the model kind
(torch → autodiff; anything else → SciPy's finite differences, ``_curve.scipy.providers``), the
whitening W (1/σ, or L⁻¹ for a covariance matrix σ = LLᵀ), the bounds and SciPy's feasible
start, the stopping tolerances and evaluation budget, and the path: the small-fit LM of
``_curve.small.single`` (every NumPy model, every torch model of up to ``SMALL_POINTS`` points
with its data on the CPU) or the sliced engine of ``_curve.large.fit`` (larger torch fits, torch
data on a GPU, or the engine's keywords). The results go
back in SciPy's form: NumPy float64 for NumPy input, torch on the data's device for torch
input; SciPy's exceptions (``ValueError``, ``TypeError``, ``RuntimeError("Optimal
parameters not found: ...")``) and ``OptimizeWarning``; pcov from the pseudo-inverse of J
as ``least_squares``' branch of SciPy computes it.

``method``: ours is one algorithm, LM with projected bounds; "lm", "trf" and "dogbox" are
all accepted and run it, with SciPy's checks ("lm" refuses bounds) and SciPy's default
evaluation budget for the named method.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from marquardt.jacobian import keeps_grad_mode

from ..._backends.blas_threads import one_blas_thread
from ..._lm.robust import ROBUST_LOSSES
from ..threads import choose_threads, torch_threads
from .args import (
    diff_step,
    feasible_start,
    hinted,
    non_negative,
    numpy_array,
    omit_nan,
    parameter_count,
    refuse_non_finite,
    scipy_bounds,
    whitening,
)
from .engine import ENGINE_KEYWORDS, engine_fit
from .providers import model_kind
from .small_path import small_fit

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
#: On the small path a torch model's steps take SciPy's finite differences (``jac``'s
#: scheme, 2-point by default) and J at p̂, for pcov, is autodiff's: P + 1 plain
#: evaluations of f cost several times less than one autodiff Jacobian on the CPU
#: (benchmarks/NOTES.md, single small fits).
_METHODS = ("trf", "dogbox", "lm")
_SCHEMES = ("2-point", "3-point", "cs")
_SCIPY_KEYWORDS = frozenset(
    {
        "maxfev",
        "max_nfev",
        "ftol",
        "xtol",
        "gtol",
        "x_scale",
        "diff_step",
        "loss",
        "f_scale",
        "epsfcn",
        "factor",
        "col_deriv",
        "tr_solver",
        "tr_options",
        "verbose",
        "jac_sparsity",
        "lsmr_tol",
        "max_iter",
    }
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
        **kwargs: SciPy's ``maxfev`` / ``max_nfev`` (the evaluation budget), ``ftol``,
            ``xtol``, ``gtol`` (1e-8 each), ``x_scale`` (``"jac"`` or positive numbers),
            ``diff_step``, ``loss``, ``f_scale``, leastsq's ``epsfcn`` (step √epsfcn) and
            ``col_deriv``; ``factor``, ``verbose``, ``tr_solver``, ``tr_options``,
            ``jac_sparsity``, ``lsmr_tol`` and ``max_iter`` have no effect. A torch model
            also takes the engine's ``device``, ``dtype``, ``slice_size`` and
            ``max_steps``, which send it to the sliced engine of `curve_fit_result`.

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
    if not callable(f):
        raise hinted(TypeError, f"f must be callable, got {type(f).__name__}.", "pass f(x, *p)")
    if "args" in kwargs:
        raise hinted(
            ValueError,
            "'args' is not a supported keyword argument.",
            "bind extra arguments into f, e.g. lambda x, a, b: g(x, a, b, extra)",
        )
    unknown = sorted(set(kwargs) - _SCIPY_KEYWORDS - ENGINE_KEYWORDS)
    if unknown:
        raise hinted(
            TypeError,
            f"curve_fit() got an unexpected keyword argument {unknown[0]!r}.",
            f"the keywords beyond SciPy's signature are {sorted(_SCIPY_KEYWORDS | ENGINE_KEYWORDS)}",
        )
    torch_out = isinstance(ydata, torch.Tensor) or isinstance(xdata, torch.Tensor)
    out_device = (
        ydata.device
        if isinstance(ydata, torch.Tensor)
        else xdata.device
        if isinstance(xdata, torch.Tensor)
        else None
    )
    n = parameter_count(f) if p0 is None else int(np.atleast_1d(numpy_array(p0)).size)
    lower, upper = scipy_bounds(bounds, n)
    start = (
        feasible_start(lower, upper)
        if p0 is None
        else np.atleast_1d(numpy_array(p0)).reshape(-1).copy()
    )
    if not np.all(np.isfinite(start)):
        raise hinted(ValueError, "`x0` must be finite.", "pass a finite p0")
    if np.any((start < lower) | (start > upper)):
        raise hinted(
            ValueError,
            "Initial guess is outside of provided bounds",
            f"p0 {start.tolist()} lies outside the bounds: start within them, or leave p0 out "
            "for SciPy's feasible start",
        )
    bounded = bool(np.any(np.isfinite(lower) | np.isfinite(upper)))
    if method is None:
        method = "trf" if bounded else "lm"
    if method not in _METHODS:
        raise hinted(
            ValueError,
            "`method` must be 'trf', 'dogbox' or 'lm'.",
            f"got {method!r}; all three run the same LM here",
        )
    if method == "lm" and bounded:
        raise hinted(
            ValueError,
            "Method 'lm' only works for unconstrained problems. Use 'trf' or 'dogbox' instead.",
            "leave method out: with bounds it defaults to 'trf'",
        )
    if jac is not None and not callable(jac) and jac not in _SCHEMES:
        raise hinted(
            ValueError,
            "`jac` must be '2-point', '3-point', 'cs' or callable.",
            f"got {jac!r}",
        )
    if check_finite is None:
        check_finite = nan_policy is None
    if nan_policy not in (None, "raise", "omit", "propagate"):
        raise hinted(
            ValueError,
            "nan_policy must be one of {None, 'raise', 'omit'}",
            f"got {nan_policy!r}",
        )
    y = numpy_array(ydata).reshape(-1) if numpy_array(ydata).ndim else numpy_array(ydata).reshape(1)
    x = xdata
    if isinstance(xdata, (list, tuple, np.ndarray)):
        x = np.asarray(xdata, dtype=np.float64)
    elif isinstance(xdata, torch.Tensor):
        x = xdata.detach().cpu().to(torch.float64).numpy()
    if check_finite:
        refuse_non_finite("ydata", y)
        if isinstance(x, np.ndarray):
            refuse_non_finite("xdata", x)
    if y.size == 0:
        raise hinted(ValueError, "`ydata` must not be empty!", "pass at least one data point")
    if not check_finite and nan_policy is not None:
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
        if has_nan:
            x, y, sigma = omit_nan(x, y, sigma)
    if method == "lm" and y.size != 1 and n > y.size:
        raise hinted(
            TypeError,
            f"The number of func parameters={n} must not exceed the number of data points={y.size}",
            "fit fewer parameters or give more points",
        )
    weights = whitening(sigma, y.size)
    maxfev = kwargs.get("max_nfev", kwargs.get("maxfev"))
    if maxfev is None:
        maxfev = 200 * (n + 1) if method == "lm" else 100 * n
    if isinstance(maxfev, bool) or not isinstance(maxfev, (int, np.integer)) or maxfev < 1:
        raise hinted(
            ValueError,
            f"`max_nfev` must be None or a positive integer, got {maxfev!r}.",
            "pass e.g. maxfev=1000",
        )
    tol = {k: non_negative(k, kwargs.get(k, 1e-8)) for k in ("ftol", "xtol", "gtol")}
    loss = kwargs.get("loss", "linear")
    if loss not in ROBUST_LOSSES:
        raise hinted(
            ValueError,
            f"`loss` must be one of {ROBUST_LOSSES} or a callable.",
            f"got {loss!r}; a callable loss is not supported here: use one of the named ones",
        )
    f_scale = non_negative("f_scale", kwargs.get("f_scale", 1.0), positive=True)
    x_scale = kwargs.get("x_scale")
    scale: np.ndarray | None = None
    if x_scale is not None and not (isinstance(x_scale, str) and x_scale == "jac"):
        try:
            scale = np.broadcast_to(np.asarray(x_scale, dtype=np.float64), (n,)).copy()
        except (TypeError, ValueError) as err:
            raise hinted(
                ValueError,
                "`x_scale` must be 'jac' or array_like with positive numbers.",
                f"got {x_scale!r}",
            ) from err
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise hinted(
                ValueError,
                "`x_scale` must be 'jac' or array_like with positive numbers.",
                f"got {x_scale!r}",
            )
    steps = diff_step(kwargs, n)
    if callable(jac) and kwargs.get("col_deriv"):  # leastsq's Jacobian by columns: P × N
        by_columns = jac

        def jac(x: Any, *p: Any) -> Any:
            return np.asarray(by_columns(x, *p)).T

    # One torch thread (and one BLAS thread from BLAS_POINTS points on) for a small fit:
    # its kernels are too short to share, and two pools alternating on busy cores made a
    # fit of 10⁴ points many times slower with torch's default two threads than with one.
    blas = one_blas_thread() if y.size >= BLAS_POINTS else nullcontext()
    with torch_threads(1), blas:
        kind, _, untracked, first = model_kind(f, x, start)
        on_device = out_device is not None and out_device.type != "cpu"
        engine = bool(ENGINE_KEYWORDS & set(kwargs)) or (
            kind == "torch" and (y.size > SMALL_POINTS or on_device)
        )
        if not (engine and kind == "torch" and weights.factor is None and jac is None):
            return small_fit(
                f,
                x,
                y,
                start,
                lower,
                upper,
                weights,
                jac,
                method,
                loss,
                f_scale,
                scale,
                steps,
                int(maxfev),
                tol,
                absolute_sigma,
                full_output,
                torch_out,
                out_device,
                kind,
                untracked,
                first,
            )
    with torch_threads(choose_threads(y.size, ENGINE_ONE_THREAD_POINTS)):
        return engine_fit(
            f,
            xdata,
            ydata,
            start,
            sigma,
            absolute_sigma,
            (lower, upper),
            loss,
            f_scale,
            full_output,
            torch_out,
            kwargs,
        )
