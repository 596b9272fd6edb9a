"""Fused kernels for ``curve_fit_batch``: one batched LM iteration, compiled once per machine.

One iteration of ``_curve.small.batched`` (f and its forward-mode Jacobian, g = Jᵀr̃, the
scaled JᵀJ, the damped Cholesky solves, the projected trial, its cost and the
accept/reject with Nielsen's λ rule) is dozens of small eager kernels, each a pass over
memory and a dispatch. Here the whole iteration is traced to one graph of ATen operations
(``make_fx``, which also unrolls ``vmap``/``jacfwd``; the traced functions are
``_curve.small.traced``) and that graph is compiled ahead of time by AOTInductor (C++/OpenMP
through the system compiler on CPUs, Triton on GPUs), so that the pointwise work and the
reductions over the N points run fused; the P × P Cholesky factorisations and solves are
traced written out (``_curve.small.unrolled``) so that they fuse too, instead of one LAPACK
call per fit. The start state (f and J at p0, ``batched.start_state``) and the inverse of
JᵀJ the covariance is formed from (``traced.gram_inverse``, shared by every model) are
compiled the same way.

A compiled kernel is specialised to its shapes, dtype, device, thread count, the
tolerances and the model f. It is kept on disk (``_curve.small.artifacts``, the user's cache
folder) under a key made of those, of f's fingerprint (``_curve.small.fingerprint``: its
code and the values it captures), of the solver's own code and of torch's version, so
that a later process loads it instead of compiling; and in a process-wide cache, so that
a loop of fits loads it once. A chunk with fewer fits than the compiled one (the last
chunk, or the running fits gathered by ``solve_batch``) is padded up to it while it holds
at least ``PAD_SHARE`` of it; below that the fits still running go to a second kernel for
``PAD_SHARE`` of the chunk (when that is at least ``TAIL_FITS``), padded the same way, and
run eagerly when fewer still.

Under ``compile="auto"`` a kept kernel is always used; a missing one is compiled (saying so
on stderr, with the time it took) when the call has at least ``COMPILE_WORK`` elements of
J over its fits; a call that may not compile uses a kernel kept for fewer threads
(``kernel_key.other_threads``) rather than none. The eager iteration runs instead, with
one ``CompileWarning`` per model, where the model cannot be traced or compiled (Python
control flow on tensor values, such as ``if x.sum() > 0:``), or no compiler is found
(``compile=True`` only: under ``"auto"`` that is silent).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ..._errors import CompileWarning
from . import artifacts, kernel_key, traced
from .batched import BatchData, BatchModel, BatchState, _iterate, start_state
from .traced import data_listed, state_listed
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
    "forget",
    "iterations",
]

#: The values of ``curve_fit_batch``'s ``compile`` keyword.
COMPILE_MODES = ("auto", True, False)
#: Elements of J over all the fits of a call (M·N·P) from which ``compile="auto"``
#: compiles a kernel that is not kept yet: a compile is paid once per machine, and every
#: later run of the same fits loads the kernel, so the threshold is where the fused
#: iteration's saving over one call, counted over a few later runs, outweighs the
#: compile (benchmarks/NOTES.md has the measured figures).
COMPILE_WORK = 1_000_000
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
    f: Callable[..., Any],
    mode: str | bool,
    device: torch.device,
    work: int,
    chunk: int,
) -> CompiledIterations | None:
    """The iteration for one ``curve_fit_batch`` call, or None for the eager one.

    **Arguments:**

    - ``f``: the model; ``mode``: ``compile`` as checked by ``check_compile``.
    - ``device``: where the fits run; ``work``: M·N·P of the call; ``chunk``: fits per chunk.

    **Returns:** None for ``compile=False``; else a ``CompiledIterations`` that uses kept
    kernels and may compile missing ones when ``mode`` is True or ``work`` is at least
    ``COMPILE_WORK`` and a compiler is found (where none is, ``compile=True`` warns once).
    """
    if mode is False:
        return None
    may_compile = mode is True or work >= COMPILE_WORK
    if may_compile and not compiler_available(device):
        if mode is True:
            no_compiler(f, device)
        may_compile = False
    return CompiledIterations(f, chunk, may_compile)


@dataclass
class _Kernel:
    """One compiled iteration and the fits it was compiled for."""

    fits: int
    run: Callable[..., tuple[torch.Tensor, ...]]
    #: The model, held so that a key made from its id stays its own while cached.
    model: Any


@dataclass
class CompiledIterations:
    """The iteration ``solve_batch`` calls: compiled where it can be, else ``_iterate``.

    One instance serves one ``curve_fit_batch`` call, whose chunks hold ``chunk`` fits (the
    last may hold fewer). A kernel comes from the process-wide cache, else from the disk
    (``_curve.small.artifacts``), else it is compiled (for ``chunk`` fits, or the tail's)
    when ``may_compile``. ``compile_seconds`` is the time this call spent tracing and
    compiling (0 when every kernel was cached or kept); ``compiled`` says whether any
    iteration ran compiled; ``finish`` ends the line announcing a compile on stderr.
    """

    f: Callable[..., Any]
    chunk: int
    may_compile: bool
    compile_seconds: float = 0.0
    compiled: bool = False
    announced: bool = False
    failed: bool = False

    def __call__(
        self,
        model: BatchModel,
        state: BatchState,
        data: BatchData,
        tol: dict[str, float],
        max_nfev: int,
    ) -> BatchState:
        fits = state.p.shape[0]

        def trace(size: int) -> tuple[Callable[..., Any], list[torch.Tensor]]:
            padded, part = _padded(state, data, size, model)
            run = traced.iteration(model, data, tol, max_nfev)
            return run, state_listed(padded) + data_listed(part)

        kernel = self._iteration(model, state.p, data, tol, max_nfev, trace)
        if kernel is None:
            return _iterate(model, state, data, tol, max_nfev)
        self.compiled = True
        if fits != kernel.fits:
            state, data = _padded(state, data, kernel.fits, model)
        out = kernel.run(*state_listed(state), *data_listed(data))
        return BatchState(*(out if fits == kernel.fits else (t[:fits] for t in out)))

    def ready(
        self,
        model: BatchModel,
        p0: torch.Tensor,
        data: BatchData,
        tol: dict[str, float],
        max_nfev: int,
    ) -> bool:
        """Whether the iteration for these fits has a kernel without compiling one: in this
        process's cache, or kept on disk (then loaded and cached for the call), as ``__call__``
        would find it."""
        return self._iteration(model, p0, data, tol, max_nfev, None) is not None

    def _iteration(
        self,
        model: BatchModel,
        p: torch.Tensor,
        data: BatchData,
        tol: dict[str, float],
        max_nfev: int,
        trace: Callable[[int], tuple[Callable[..., Any], list[torch.Tensor]]] | None,
    ) -> _Kernel | None:
        """The iteration's kernel for the fits of ``p``: cached, kept on disk, or compiled
        from ``trace(size)`` (None: only looked for); None where they run eagerly."""
        fits = p.shape[0]
        shapes = kernel_key.shapes(self.f, p, data, tol, max_nfev, model.x_per_fit)
        kernel = _serving(shapes, fits)
        size = _size(self.chunk, fits)
        if kernel is not None or not size:
            return kernel
        described = kernel_key.description(self.f, shapes, size, model, p.device)
        built = None if trace is None else (lambda: trace(size))
        return self._kernel(shapes, size, described, p.device, built)

    def start(self, model: BatchModel, p0: torch.Tensor, data: BatchData) -> BatchState:
        """``start_state``, compiled as the iteration is (same key, chunk and padding)."""
        fits = p0.shape[0]
        shapes = ("start", *kernel_key.shapes(self.f, p0, data, {}, 0, model.x_per_fit))
        kernel = _serving(shapes, fits)
        if kernel is None and fits == self.chunk:

            def trace() -> tuple[Callable[..., Any], list[torch.Tensor]]:
                return traced.start(model, data), [p0, *data_listed(data)]

            described = kernel_key.description(self.f, shapes, fits, model, p0.device)
            kernel = self._kernel(shapes, fits, described, p0.device, trace)
        if kernel is None:
            return start_state(model, p0, data)
        if fits != kernel.fits:
            index = torch.arange(kernel.fits, device=p0.device)
            index = torch.where(index < fits, index, 0)
            p0, data = p0[index], data.take(index, model.x_per_fit)
        out = kernel.run(p0, *data_listed(data))
        return BatchState(*(t[:fits] for t in out))

    def gram_inverse(self, gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``traced.gram_inverse`` for the covariance, compiled as the start is (a kernel
        for a full chunk, shared by every model of these shapes)."""
        fits = gram.shape[0]
        shapes = ("covariance", None, *gram.shape[1:], gram.dtype, gram.device)
        shapes += (torch.get_num_threads(),)
        kernel = _serving(shapes, fits)
        if kernel is None and fits == self.chunk:

            def trace() -> tuple[Callable[..., Any], list[torch.Tensor]]:
                return traced.gram_inverse, [gram]

            described = kernel_key.covariance(shapes, fits, gram.device)
            kernel = self._kernel(shapes, fits, described, gram.device, trace)
        if kernel is None:
            return traced.gram_inverse(gram)
        if fits != kernel.fits:
            index = torch.arange(kernel.fits, device=gram.device)
            gram = gram[torch.where(index < fits, index, 0)]
        out, good = kernel.run(gram)
        return out[:fits], good[:fits]

    def _kernel(
        self,
        shapes: tuple[Any, ...],
        fits: int,
        description: dict[str, Any] | None,
        device: torch.device,
        trace: Callable[[], tuple[Callable[..., Any], list[torch.Tensor]]] | None,
    ) -> _Kernel | None:
        """The kernel for ``shapes`` and ``fits`` fits (``description``: its key's parts,
        None where it has none): kept on disk, or compiled (when ``may_compile``) from
        ``trace()``'s function and inputs; None: run eagerly. Without ``trace`` it only
        looks (a bad kept kernel is left for a call that can rebuild it)."""
        looked = (shapes, fits) in _ABSENT
        if shapes in _FAILED or (looked and not self.may_compile):
            return None
        key = None if description is None else artifacts.key_of(description)
        run, bad = None, key in _BAD
        if key is not None and not (looked or bad):
            run, bad = artifacts.load(key, device)
            if bad:
                _BAD.add(key)
        if description is not None and run is None and not (bad or looked or self.may_compile):
            for other in kernel_key.other_threads(description, device):
                run, _ = artifacts.load(artifacts.key_of(other), device)
                if run is not None:
                    break
        if run is None and not bad:
            _ABSENT[(shapes, fits)] = None
            while len(_ABSENT) > 4 * CACHE_SIZE:
                _ABSENT.popitem(last=False)
        # A kept kernel that cannot be trusted was worth compiling once: it is rebuilt.
        rebuild = bad and compiler_available(device)
        if run is None and trace is not None and (self.may_compile or rebuild):
            run = self._build(shapes, key, description or {}, device, trace)
            _ABSENT.pop((shapes, fits), None)
            _BAD.discard(key)
        if run is None:
            return None
        kernel = _Kernel(fits, run, self.f)
        _CACHE[(shapes, fits)] = kernel
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
        return kernel

    def _build(
        self,
        shapes: tuple[Any, ...],
        key: str | None,
        description: dict[str, Any],
        device: torch.device,
        trace: Callable[[], tuple[Callable[..., Any], list[torch.Tensor]]],
    ) -> Callable[..., tuple[torch.Tensor, ...]] | None:
        """Trace and compile ahead of time, keep the package (under ``key``, when there is
        one) and load it; None (and one warning per model) where that fails."""
        self._announce(device)
        started = time.perf_counter()

        def build(path: Path) -> None:
            run, inputs = trace()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                table = decompositions(inputs[0].shape[-1])
                graph = make_fx(run, table, tracing_mode="real")(*inputs)
                artifacts.compile_package(graph, inputs, path)

        try:
            return artifacts.save(key, description, build, device)
        except Exception as err:  # any failure means: run eagerly
            self.failed = True
            _FAILED.add(shapes)
            _warn_once(self.f, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")
            return None
        finally:
            self.compile_seconds += time.perf_counter() - started

    def _announce(self, device: torch.device) -> None:
        if self.announced:
            return
        self.announced = True
        name = getattr(self.f, "__qualname__", type(self.f).__name__)
        threads = torch.get_num_threads()
        where = f"{threads} thread{'s' * (threads != 1)}" if device.type == "cpu" else device
        sys.stderr.write(
            f"marquardt: compiling curve_fit_batch's iteration for the model {name} "
            f"(on {where}), once for this machine; later runs load it ... "
        )
        sys.stderr.flush()

    def finish(self) -> None:
        """End the stderr line of a compile with the time it took (nothing if none)."""
        if self.announced:
            done = "failed (see the warning) after" if self.failed else "compiled in"
            sys.stderr.write(f"{done} {self.compile_seconds:.1f} s\n")
            sys.stderr.flush()
            self.announced = False


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


_CACHE: OrderedDict[tuple[Any, ...], _Kernel] = OrderedDict()
_FAILED: set[tuple[Any, ...]] = set()
#: Keys of kept kernels found untrustworthy and not rebuilt yet by this process (a look
#: without a trace, ``ready``, leaves the rebuild to the call that follows).
_BAD: set[str | None] = set()
#: (shapes, fits) looked for on disk and not found by this process, most recent last.
_ABSENT: OrderedDict[tuple[Any, ...], None] = OrderedDict()
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
    key = kernel_key.identity(f)
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


def forget() -> None:
    """Empty this process's caches of kernels, failures, disk misses and warnings (the
    kept kernels on disk stay)."""
    for cache in (_CACHE, _FAILED, _BAD, _ABSENT, _WARNED, artifacts.UNTRUSTED):
        cache.clear()
