"""Fused kernels for ``curve_fit_batch``: one batched LM iteration, compiled once per shape.

One iteration of ``_curve.small.batched`` (f and its forward-mode Jacobian, g = Jᵀr̃, the
scaled JᵀJ, the damped Cholesky solves, the projected trial, its cost and the
accept/reject with Nielsen's λ rule) is dozens of small eager kernels, each a pass over
memory and a dispatch. Here the whole iteration is traced to one graph of ATen operations
(``make_fx``, which also unrolls ``vmap``/``jacfwd``) and that graph is compiled by
``torch.compile`` (inductor: C++/OpenMP through the system compiler on CPUs, Triton on
GPUs), so that the pointwise work and the reductions over the N points run fused; the
P × P Cholesky factorisations and solves are traced written out (``_curve.small.unrolled``) so
that they fuse too, instead of one LAPACK call per fit. The start state (f and J at p0,
``batched.start_state``) is compiled the same way. The arithmetic is that of
``batched`` itself, traced, not a second copy.

A compiled iteration is specialised to its shapes, dtype, device, thread count, the
tolerances and the model f; it is kept in a process-wide cache under that key, so a loop
of fits with one model compiles once, and inductor's own on-disk cache (its default
``TORCHINDUCTOR_CACHE_DIR``, outside any repository) shortens the compile of a later
process. A chunk with fewer fits than the compiled one (the last chunk, or the running
fits gathered by ``solve_batch``) is padded up to it while it holds at least
``PAD_SHARE`` of it; below that the fits still running go to a second kernel for
``PAD_SHARE`` of the chunk (when that is at least ``TAIL_FITS``), padded the same way,
and run eagerly when fewer still. A call with fewer fits than a cached kernel uses it the same way.

The eager iteration runs instead, with one ``CompileWarning`` per model, where the model
cannot be traced or compiled (Python control flow on tensor values, such as ``if x.sum()
> 0:``), or no compiler is found (``compile=True`` only: under ``"auto"`` that is silent);
and silently under ``"auto"`` where the call is too small to repay a compile (fewer than
``COMPILE_WORK`` elements of J over all its fits, unless this process has compiled the
kernel already).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ..._errors import CompileWarning
from .batched import BatchData, BatchModel, BatchState, _iterate, start_state
from .unrolled import decompositions

__all__ = [
    "CACHE_SIZE",
    "COMPILE_MODES",
    "COMPILE_WORK",
    "PAD_SHARE",
    "TAIL_FITS",
    "CompiledIterations",
    "check_compile",
    "compiler_available",
    "iterations",
]

#: The values of ``curve_fit_batch``'s ``compile`` keyword.
COMPILE_MODES = ("auto", True, False)
#: Elements of J over all the fits of a call (M·N·P) from which ``compile="auto"``
#: compiles: a compile takes 15-25 s on a 2-core CPU and the fused iteration saves about
#: 10 µs per fit-iteration there (5 × 5 Gaussians, float32, one thread: 83 000 eager
#: against 430 000 compiled fit-iterations/s), so it repays itself from about 2·10⁶
#: fit-iterations, some 2.4·10⁵ such fits (3·10⁷ elements of J).
COMPILE_WORK = 30_000_000
#: A chunk holding at least this share of the compiled fits is padded up to them and runs
#: compiled; a smaller one runs eagerly.
PAD_SHARE = 0.4
#: The fewest fits a second, smaller kernel is compiled for: the fits still running late
#: in a chunk, once fewer than ``PAD_SHARE`` of it, run in a kernel for ``PAD_SHARE`` of
#: the chunk rather than eagerly (where each iteration costs some milliseconds of dispatch
#: however few the fits) when that kernel holds at least this many fits.
TAIL_FITS = 1024
#: Compiled iterations kept per process (least recently used dropped first).
CACHE_SIZE = 16

_STATE = tuple(f.name for f in fields(BatchState))


def _state_listed(state: BatchState) -> list[torch.Tensor]:
    return [getattr(state, name) for name in _STATE]


def check_compile(value: Any) -> str | bool:
    """``compile`` as given, refused (before any work) unless one of ``COMPILE_MODES``."""
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    raise ValueError(
        f"compile must be 'auto', True or False, got {value!r}. HINT: leave it out to "
        "compile only calls large enough to repay the compile"
    )


def compiler_available(device: torch.device) -> bool:
    """Whether inductor can build kernels here: Triton for a GPU, a C++ compiler (``CXX``
    or g++, c++, clang++ on the PATH) for the CPU."""
    if device.type == "cuda":
        return importlib.util.find_spec("triton") is not None
    if device.type != "cpu":
        return False
    names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    return any(name and shutil.which(name) for name in names)


def iterations(
    f: Callable[..., Any], mode: str | bool, device: torch.device, work: int, chunk: int
) -> CompiledIterations | None:
    """The iteration for one ``curve_fit_batch`` call, or None for the eager one.

    **Arguments:**

    - ``f``: the model; ``mode``: ``compile`` as checked by ``check_compile``.
    - ``device``: where the fits run; ``work``: M·N·P of the call; ``chunk``: fits per chunk.

    **Returns:** None for ``compile=False``, and where no compiler is found (with one
    ``CompileWarning`` for ``compile=True``); else a ``CompiledIterations`` that may compile
    when ``mode`` is True or ``work`` is at least ``COMPILE_WORK`` (under ``"auto"`` a
    smaller call still uses a kernel this process compiled before).
    """
    if mode is False:
        return None
    if not compiler_available(device):
        if mode is True:
            no_compiler(f, device)
        return None
    return CompiledIterations(f, chunk, mode is True or work >= COMPILE_WORK)


@dataclass
class _Kernel:
    """One compiled iteration and the fits it was compiled for."""

    fits: int
    run: Callable[..., tuple[torch.Tensor, ...]]
    #: The model, held so that a key made from its id stays its own while cached.
    model: Any


def _data_listed(part: BatchData) -> list[torch.Tensor]:
    """``part``'s tensors in a fixed order (an empty one for a w or mask that is None)."""
    empty = part.y[:, :0]
    return [
        part.x,
        part.y,
        part.w if part.w is not None else empty,
        part.mask if part.mask is not None else empty,
        part.lower,
        part.upper,
        part.loss_index,
        part.f_scale,
    ]


def _data_built(tensors: tuple[torch.Tensor, ...], like: BatchData) -> BatchData:
    """The ``BatchData`` of ``_data_listed``'s tensors, with ``like``'s losses and Nones."""
    x, y, w, mask, lower, upper, loss_index, f_scale = tensors
    return BatchData(
        x,
        y,
        w if like.w is not None else None,
        mask if like.mask is not None else None,
        lower,
        upper,
        like.losses,
        loss_index,
        f_scale,
    )


def _iteration(
    model: BatchModel, like: BatchData, tol: dict[str, float], max_nfev: int
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``_iterate`` as a function of the state's and data's tensors (what ``make_fx``
    traces)."""

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = BatchState(*tensors[: len(_STATE)])
        new = _iterate(model, state, _data_built(tensors[len(_STATE) :], like), tol, max_nfev)
        return tuple(getattr(new, name) for name in _STATE)

    return run


def _start(model: BatchModel, like: BatchData) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``start_state`` as a function of p0's and the data's tensors."""

    def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        new = start_state(model, tensors[0], _data_built(tensors[1:], like))
        return tuple(getattr(new, name) for name in _STATE)

    return run


@dataclass
class CompiledIterations:
    """The iteration ``solve_batch`` calls: compiled where it can be, else ``_iterate``.

    One instance serves one ``curve_fit_batch`` call, whose chunks hold ``chunk`` fits (the
    last may hold fewer); the compiled kernels live in the process-wide cache. It compiles
    (for ``chunk`` fits) when ``may_compile`` and no cached kernel serves the fits.
    ``compile_seconds`` is the time this call spent tracing and compiling (0 when the
    cache held the kernel); ``compiled`` says whether any iteration ran compiled.
    """

    f: Callable[..., Any]
    chunk: int
    may_compile: bool
    compile_seconds: float = 0.0
    compiled: bool = False

    def __call__(
        self,
        model: BatchModel,
        state: BatchState,
        data: BatchData,
        tol: dict[str, float],
        max_nfev: int,
    ) -> BatchState:
        fits = state.p.shape[0]
        shapes = _key(self.f, state.p, data, tol, max_nfev, model.x_per_fit)
        kernel = _serving(shapes, fits)
        size = _size(self.chunk, fits)
        if kernel is None and self.may_compile and size and shapes not in _FAILED:
            padded, part = _padded(state, data, size, model)
            run = _iteration(model, data, tol, max_nfev)
            kernel = self._build(shapes, size, run, _state_listed(padded) + _data_listed(part))
        if kernel is None:
            return _iterate(model, state, data, tol, max_nfev)
        self.compiled = True
        if fits != kernel.fits:
            state, data = _padded(state, data, kernel.fits, model)
        out = kernel.run(*_state_listed(state), *_data_listed(data))
        return BatchState(*(t[:fits] for t in out))

    def start(self, model: BatchModel, p0: torch.Tensor, data: BatchData) -> BatchState:
        """``start_state``, compiled as the iteration is (same key, chunk and padding)."""
        fits = p0.shape[0]
        shapes = ("start", *_key(self.f, p0, data, {}, 0, model.x_per_fit))
        kernel = _serving(shapes, fits)
        if kernel is None and self.may_compile and fits == self.chunk and shapes not in _FAILED:
            kernel = self._build(shapes, fits, _start(model, data), [p0, *_data_listed(data)])
        if kernel is None:
            return start_state(model, p0, data)
        if fits != kernel.fits:
            index = torch.arange(kernel.fits, device=p0.device)
            index = torch.where(index < fits, index, 0)
            p0, data = p0[index], data.take(index, model.x_per_fit)
        out = kernel.run(p0, *_data_listed(data))
        return BatchState(*(t[:fits] for t in out))

    def _build(
        self,
        shapes: tuple[Any, ...],
        fits: int,
        run: Callable[..., tuple[torch.Tensor, ...]],
        inputs: list[torch.Tensor],
    ) -> _Kernel | None:
        """Trace ``run`` on ``inputs`` (``fits`` fits) and compile it; None (and one warning
        per model) where that fails."""
        started = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                table = decompositions(inputs[0].shape[-1])
                graph = make_fx(run, table, tracing_mode="real")(*inputs)
                compiled = torch.compile(graph, fullgraph=True, dynamic=False)
                compiled(*inputs)  # inductor compiles at the first call
        except Exception as err:  # any failure means: run eagerly
            _FAILED.add(shapes)
            _warn_once(self.f, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")
            return None
        finally:
            self.compile_seconds += time.perf_counter() - started
        kernel = _Kernel(fits, compiled, self.f)
        _CACHE[(shapes, fits)] = kernel
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
        return kernel


def _size(chunk: int, fits: int) -> int:
    """The fits to compile for ``fits`` running fits of a call with ``chunk``-fit chunks:
    ``chunk``, or for the fits still running late in a chunk ``chunk``·``PAD_SHARE`` when
    that is at least ``TAIL_FITS``; 0 where ``fits`` fits neither (they run eagerly)."""
    tail = round(chunk * PAD_SHARE)
    for size in (chunk, tail if tail >= TAIL_FITS else 0):
        if size and PAD_SHARE * size <= fits <= size:
            return size
    return 0


def _padded(
    state: BatchState, data: BatchData, fits: int, model: BatchModel
) -> tuple[BatchState, BatchData]:
    """State and data of ``fits`` fits: these, then copies of the first (whose results are
    dropped)."""
    if state.p.shape[0] == fits:
        return state, data
    index = torch.arange(fits, device=state.p.device)
    index = torch.where(index < state.p.shape[0], index, 0)
    return state.take(index), data.take(index, model.x_per_fit)


def _key(
    f: Callable[..., Any],
    p: torch.Tensor,
    data: BatchData,
    tol: dict[str, float],
    max_nfev: int,
    x_per_fit: bool,
) -> tuple[Any, ...]:
    """What a compiled iteration is specialised to, besides its number of fits."""
    return (
        _identity(f),
        tuple(data.y.shape[1:]),
        tuple(data.x.shape[1:] if x_per_fit else data.x.shape),
        p.shape[1],
        x_per_fit,
        p.dtype,
        p.device,
        torch.get_num_threads(),
        data.losses,
        data.w is not None,
        data.mask is not None,
        tuple(sorted(tol.items())),
        max_nfev,
    )


def _identity(f: Callable[..., Any]) -> Any:
    try:
        hash(f)
    except TypeError:
        return id(f)
    return f


_CACHE: OrderedDict[tuple[Any, ...], _Kernel] = OrderedDict()
_FAILED: set[tuple[Any, ...]] = set()
_WARNED: OrderedDict[Any, None] = OrderedDict()


def _serving(shapes: tuple[Any, ...], fits: int) -> _Kernel | None:
    """The cached kernel for these shapes with the fewest fits that still holds ``fits``
    while ``fits`` is at least ``PAD_SHARE`` of them (marked most recently used)."""
    found = [
        (key, k)
        for key, k in _CACHE.items()
        if key[0] == shapes and PAD_SHARE * k.fits <= fits <= k.fits
    ]
    if not found:
        return None
    key, kernel = min(found, key=lambda item: item[1].fits)
    _CACHE.move_to_end(key)
    return kernel


def _warn_once(f: Callable[..., Any], reason: str) -> None:
    key = _identity(f)
    if key in _WARNED:
        return
    _WARNED[key] = None
    while len(_WARNED) > 4 * CACHE_SIZE:
        _WARNED.popitem(last=False)
    name = getattr(f, "__qualname__", type(f).__name__)
    warnings.warn(
        f"curve_fit_batch could not compile its iteration for the model {name} and runs it "
        f"eagerly (same results, slower): {reason}. HINT: write f without Python control "
        "flow on tensor values (use torch.where), or pass compile=False to skip the attempt",
        CompileWarning,
        stacklevel=4,
    )


def no_compiler(f: Callable[..., Any], device: torch.device) -> None:
    """The one warning for ``compile=True`` where ``compiler_available`` is False."""
    _warn_once(
        f,
        "no compiler found for "
        + ("Triton (GPU)" if device.type == "cuda" else "C++ (set CXX or install g++)"),
    )
