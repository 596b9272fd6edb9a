"""``curve_fit_batch``: M independent fits of one model f(x, *p) in one call.

The fits run through the batched LM of ``_curve.batched_lm.driver`` in chunks of fits sized from
the device's free memory (``chunk_fits``), so that any M fits; each chunk's results equal
those of one chunk holding every fit; pcov, χ² and the final statuses are
``_curve.batch.results``'s. NumPy in, NumPy out; torch in, torch out on the data's device;
either in the precision the fits ran in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marquardt.jacobian import keeps_grad_mode

from ..._lm.memory_fit import usable_memory
from ..batched_lm.driver import solve_batch
from ..batched_lm.state import STATUS_MESSAGES, BatchData
from ..batched_lm.traced import gram_inverse
from ..compiled_lm import CompiledIterations, check_compile, iterations
from ..threads import batch_crossover, choose_threads, torch_threads
from .args import BatchArgs, BatchKeywords, batch_args
from .model import BatchModel, check_model
from .reduced import reduction
from .results import ChunkResult, chunk_result, warn_results

__all__ = [
    "BYTES_PER_FIT_J",
    "BYTES_PER_FIT_POINT",
    "CPU_CHUNK_FITS",
    "chunk_fits",
    "curve_fit_batch",
]

#: Elements per fit held per element of J (N·P) during an iteration: J, its row-scaled
#: copy, the trial's J and its scaled copy, and forward mode's P tangents of f's
#: intermediates, counted as twelve more.
BYTES_PER_FIT_J = 16
#: Elements per fit held per point (N): x (per fit), y, w, the mask, r and the scaled r
#: at p and at the trial, the linear model, the robust weights and f's values.
BYTES_PER_FIT_POINT = 24
#: The fraction of the usable memory one chunk may take.
CHUNK_SHARE = 0.5
#: At most this many fits per chunk on the CPU: larger chunks leave the caches and pay for
#: fresh pages every iteration (measured on 2-D Gaussian spots, ``bench_batch_fit``).
CPU_CHUNK_FITS = 16_384


def chunk_fits(
    fits: int, points: int, params: int, inputs: int, item: int, device: torch.device
) -> int:
    """Fits per chunk: ``CHUNK_SHARE`` of the usable memory (``_lm.memory_fit``: 0.8 of the
    free memory of the GPU, or of the host's MemAvailable) over the bytes one fit holds,
    item·(16·N·P + (24 + k)·N + 4·P² + 16·P), at least 1 and at most M (on the CPU at
    most ``CPU_CHUNK_FITS``)."""
    if fits == 1:
        return 1
    per_fit = item * (
        BYTES_PER_FIT_J * points * params
        + (BYTES_PER_FIT_POINT + inputs) * points
        + 4 * params * params
        + 16 * params
    )
    usable, _ = usable_memory(device, None)
    cap = fits if device.type != "cpu" else min(fits, CPU_CHUNK_FITS)
    return int(max(1, min(cap, CHUNK_SHARE * usable // per_fit)))


def _chunk(args: BatchArgs, index: slice) -> tuple[torch.Tensor, BatchData]:
    return args.p0[index], BatchData(
        x=args.x[index] if args.x_per_fit else args.x,
        y=args.y[index],
        w=None if args.w is None else args.w[index],
        mask=None if args.mask is None else args.mask[index],
        lower=args.lower[index],
        upper=args.upper[index],
        losses=args.losses,
        loss_index=args.loss_index[index],
        f_scale=args.f_scale[index],
        free=None if args.free is None else args.free[index],
        estimator=args.estimator,
    )


@contextmanager
def _finishing(iterate: CompiledIterations | None) -> Iterator[None]:
    """A block after which the stderr line of a compile is ended, however it ends."""
    try:
        yield
    finally:
        if iterate is not None:
            iterate.finish()


@dataclass(frozen=True)
class BatchRun:
    """How a checked call runs: its model, the fits per chunk, the iteration (None: the
    eager one) and the torch threads on the CPU (None: as set)."""

    model: BatchModel
    size: int
    iterate: CompiledIterations | None
    threads: int | None


def planned(
    f: Callable[..., Any],
    args: BatchArgs,
    compile_mode: str | bool,
    chunk_size: int | None,
    threads: int | None,
) -> BatchRun:
    """The chunks, the iteration and the threads of a call (``curve_fit_batch``'s docstring
    gives the rules); ``threads`` as given, None for the default."""
    fits, points = args.y.shape
    params = args.p0.shape[1]
    free = _shared_free(args)
    model = BatchModel(f, points, args.x_per_fit, free, _shared_values(args, free))
    inputs = args.x.shape[-2] if args.x.dim() == (3 if args.x_per_fit else 2) else 1
    size = chunk_fits(
        fits,
        points,
        params,
        inputs if args.x_per_fit else 0,
        args.y.element_size(),
        args.y.device,
    )
    size = min(size, int(chunk_size)) if chunk_size is not None else size
    # The fixed parameters and the Poisson estimator run the eager iteration: the compiled
    # kernels serve least squares over every parameter.
    eager = args.free is not None or args.estimator != "lse"
    work = fits * points * params
    iterate = None if eager else iterations(f, compile_mode, args.y.device, work, size, fits)
    if args.y.device.type != "cpu":
        threads = None
    elif threads is None:
        fused = iterate is not None and iterate.may_compile
        crossover = batch_crossover(points, params, args.y.element_size(), fused)
        threads = choose_threads(min(size, fits) * points * params, crossover)
    return BatchRun(model, size, iterate, None if threads is None else int(threads))


def _shared_free(args: BatchArgs) -> tuple[int, ...] | None:
    """The fitted parameters' indices when every fit fits the same ones and some are
    fixed (``BatchModel``'s ``free``), else None."""
    if args.free is None or not bool((args.free.all(0) == args.free.any(0)).all()):
        return None
    return tuple(int(k) for k in torch.nonzero(args.free[0]).reshape(-1))


def _shared_values(args: BatchArgs, free: tuple[int, ...] | None) -> dict[int, float]:
    """The fixed parameters whose p0 every fit shares, with that value (``BatchModel``'s
    ``constants``)."""
    if free is None:
        return {}
    fixed = [k for k in range(args.p0.shape[1]) if k not in free]
    column = args.p0[:, fixed]
    same = (column == column[:1]).all(0)
    return {k: float(column[0, i]) for i, k in enumerate(fixed) if bool(same[i])}


def kernel_ready(run: BatchRun, args: BatchArgs) -> bool:
    """Whether the first chunk's iteration has a compiled kernel, in this process or kept
    on disk (loaded by the asking): then f was traced at these shapes before, and
    ``check_model`` has nothing left to find."""
    if run.iterate is None:
        return False
    start, data = _chunk(args, slice(0, run.size))
    with torch_threads(run.threads):
        return run.iterate.ready(run.model, start, data)


def solved(
    run: BatchRun, args: BatchArgs, absolute_sigma: bool
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Every chunk of a planned call solved: (p̂ (M × P), pcov (M × P × P), the per-fit
    ``status``, ``cost``, ``chi_square``, ``nfev``, ``njev`` and ``steps``, with
    ``compile_seconds`` and ``compiled``), on the fits' device."""
    iterate, model, size = run.iterate, run.model, run.size
    parts: list[ChunkResult] = []
    with torch_threads(run.threads), _finishing(iterate):
        for begin in range(0, args.y.shape[0], size):
            start, data = _chunk(args, slice(begin, begin + size))
            state = solve_batch(
                model,
                start,
                data,
                tests=args.tests,
                iterate=iterate,
                initial=None if iterate is None else iterate.start,
            )
            inverse = gram_inverse if iterate is None else iterate.gram_inverse
            parts.append(chunk_result(model, state, data, absolute_sigma, inverse))
    info: dict[str, Any] = {
        name: torch.cat([getattr(part.state, name) for part in parts])
        for name in ("status", "cost", "nfev", "njev", "steps")
    }
    info["chi_square"] = torch.cat([part.chi_square for part in parts])
    info["compile_seconds"] = 0.0 if iterate is None else iterate.compile_seconds
    info["compiled"] = iterate is not None and iterate.compiled
    popt = torch.cat([part.state.p for part in parts])
    return popt, torch.cat([part.pcov for part in parts]), info


@keeps_grad_mode
def curve_fit_batch(
    f: Callable[..., Any],
    xdata: Any,
    ydata: Any,
    p0: Any = None,
    sigma: Any = None,
    absolute_sigma: bool = False,
    bounds: Any = (-np.inf, np.inf),
    *,
    loss: Any = "linear",
    f_scale: Any = 1.0,
    nan_policy: str | None = None,
    ftol: float | None = None,
    xtol: float | None = None,
    gtol: float | None = None,
    max_nfev: int | None = None,
    maxfev: int | None = None,
    full_output: bool = False,
    chunk_size: int | None = None,
    device: Any = None,
    dtype: torch.dtype | None = None,
    threads: int | None = None,
    compile: str | bool = "auto",
    fixed: Any = None,
    estimator: str = "lse",
    max_iterations: int | None = None,
) -> Any:
    """Fit f(x, *p) to each of M data sets, each fit as ``curve_fit`` fits it.

    f is written for one fit, with torch operations, and vectorised over the fits by
    ``torch.func.vmap`` (docs/batch-fitting.md says what that asks of f); ydata is
    (M, N), xdata shared ((N,), (k, N)) or per fit ((M, N), (M, k, N)); p0, sigma, bounds,
    loss and f_scale shared or one per fit (``_curve.batch.args``). Returns ``(popt,
    pcov)``, (M, P) and (M, P, P); with ``full_output=True`` also a dict of per-fit
    ``status`` (SciPy's 0-4; −1 singular, −2 non-finite, −3 too few points, −4 a
    non-positive Poisson model: ``messages``), ``cost``, ``chi_square`` (Gpufit's: Σr², or
    the Poisson deviance), ``nfev``, ``njev`` and ``steps``. Fits that do not converge are
    results, not errors: an ``OptimizeWarning`` counts them. A p0 outside the bounds is
    projected into them with one ``OptimizeWarning`` (Gpufit's convention; ``curve_fit``
    keeps SciPy's refusal). Tolerances default to 1e-8 (ftol and xtol: at least 10·ε of
    ``dtype``); ``max_nfev`` (or ``maxfev``) to SciPy's 100·P with bounds, else 200·(P + 1);
    ``max_iterations=k`` (Gpufit's) allows k trial steps, k + 1 evaluations.
    ``chunk_size`` caps the fits solved at once (default: sized from memory); ``device``
    and ``dtype`` default to ydata's (NumPy: the CPU; float32 for float32 data, else
    float64), and the results come back in ``dtype``. On the CPU the
    fits run on ``threads`` torch threads; by default (None) on one, unless a chunk holds
    at least ``BATCH_THREAD_WORK`` elements of J (fits × N × P) and either the iteration
    runs compiled or each fit holds at least ``FIT_THREAD_BYTES`` of J, where a second
    thread can pay, and then on as many as torch's setting allows and the machine has
    idle cores for (its cores less the one-minute load average, rounded): never more
    threads than that, since on busy cores each short kernel waits for a descheduled
    thread and the fits run many times slower than on one (``_curve.threads``).
    ``compile`` (``"auto"``, True or False) runs each LM iteration as one compiled graph
    of fused kernels (``_curve.compiled_lm``): ``"auto"`` uses a kernel compiled
    before, in this process or kept on disk by an earlier one (``marquardt.solver.cache``),
    and compiles a missing one inline (with a progress line on stderr) where the call
    repays it, else builds it in a background process for calls of at least
    ``COMPILE_WORK`` elements of J (M·N·P) while the call runs eagerly; True compiles
    inline (but the kernel for a chunk's last running fits, which a call of one chunk
    does not repay: built in the background after the call where background builds are
    on); a model that cannot be compiled runs eagerly with one ``CompileWarning``. ``full_output`` adds ``compile_seconds`` (this call's
    compile time) and ``compiled``. ``fixed`` and ``estimator="poisson"`` run the eager
    iteration (no compiled kernel serves them).

    Arguments:
        f: the model ``f(x, *p)`` for one fit, with torch operations.
        xdata: shared ((N,), (k, N)) or per fit ((M, N), (M, k, N)).
        ydata: the M data sets, (M, N).
        p0: the starting parameters, shared (P,) or per fit (M, P).
        sigma: standard deviations, shared or per fit.
        absolute_sigma: whether ``sigma`` is absolute, as in ``curve_fit``.
        bounds: ``(lower, upper)``, shared or per fit.
        loss: SciPy's robust loss, shared or per fit.
        f_scale: the robust loss's scale, shared or per fit.
        nan_policy: ``curve_fit``'s.
        ftol: MINPACK's relative reduction test.
        xtol: MINPACK's relative step test.
        gtol: MINPACK's orthogonality test.
        max_nfev: the evaluation budget per fit.
        maxfev: ``max_nfev``'s other name.
        full_output: also return the dict of per-fit results.
        chunk_size: the most fits solved at once.
        device: where the fits run.
        dtype: the precision they run in.
        threads: the torch threads on the CPU (≥ 1).
        compile: ``"auto"``, True or False: each LM iteration as one compiled graph.
        fixed: booleans, (P,) or (M, P), True for the parameters held at their p0
            (Gpufit's ``parameters_to_fit``, inverted); their rows and columns of pcov
            are zero.
        estimator: ``"lse"`` (least squares) or ``"poisson"`` (Gpufit's maximum
            likelihood for counts: no sigma or robust loss; pcov the inverse Fisher
            information, ``_curve.batched_lm.estimators``).
        max_iterations: the most LM iterations (trial steps) per fit, beside ``max_nfev``.

    Returns:
        ``(popt, pcov)``, or ``(popt, pcov, info)`` with ``full_output=True``.

    Raises:
        ValueError: bad input (``threads`` or ``chunk_size`` not a positive integer,
            among others), before any work.
        TypeError: ``f`` not callable.
    """
    compile_mode = check_compile(compile)
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1
    ):
        raise ValueError(
            f"threads must be a positive integer or None, got {threads!r}. HINT: leave it "
            "out for the default (one thread unless the work and idle cores allow more)"
        )
    given = BatchKeywords(
        loss=loss,
        f_scale=f_scale,
        nan_policy=nan_policy,
        ftol=ftol,
        xtol=xtol,
        gtol=gtol,
        max_nfev=max_nfev if max_nfev is not None else maxfev,
        device=device,
        dtype=dtype,
        fixed=fixed,
        estimator=estimator,
        max_iterations=max_iterations,
    )
    args = batch_args(f, xdata, ydata, p0, sigma, bounds, given)
    if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) < 1):
        raise ValueError(
            f"chunk_size must be a positive integer, got {chunk_size!r}. HINT: pass e.g. 10000"
        )
    reduced = reduction(f, args)
    if reduced is not None:  # fixed values shared by every fit: out of the problem
        f, args, compile_mode = reduced.f, reduced.args, False
    run = planned(f, args, compile_mode, chunk_size, threads)
    if not kernel_ready(run, args):
        check_model(run.model, args.p0, args.x)
    popt, pcov, info = solved(run, args, absolute_sigma)
    if reduced is not None:
        popt, pcov = reduced.expanded(popt, pcov)
    warn_results(info["status"], pcov)

    def out(t: torch.Tensor) -> Any:
        return t.to(args.out_device) if args.torch_out else t.cpu().numpy()

    if not full_output:
        return out(popt), out(pcov)
    return (
        out(popt),
        out(pcov),
        {
            **{k: out(v) for k, v in info.items() if isinstance(v, torch.Tensor)},
            "messages": STATUS_MESSAGES,
            "compile_seconds": info["compile_seconds"],
            "compiled": info["compiled"],
        },
    )
