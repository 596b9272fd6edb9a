"""Fused kernels for ``curve_fit_batch``: one batched LM iteration, compiled once per machine.

One iteration of ``_curve.batched_lm.driver`` (f and its forward-mode Jacobian, g = Jᵀr̃, the
scaled JᵀJ, the damped Cholesky solves, the projected trial, its cost and the
accept/reject with Nielsen's λ rule) is dozens of small eager kernels, each a pass over
memory and a dispatch. Here the whole iteration is traced to one graph of ATen operations
(``make_fx``, which also unrolls ``vmap``/``jacfwd``; the traced functions are
``_curve.batched_lm.traced``) and that graph is compiled ahead of time by AOTInductor (C++/OpenMP
through the system compiler on CPUs, Triton on GPUs), so that the pointwise work and the
reductions over the N points run fused; the P × P Cholesky factorisations and solves are
traced written out (``_curve.batched_lm.unrolled``) so that they fuse too, instead of one LAPACK
call per fit. The start state (f and J at p0, ``batched.start_state``) is the other branch
of the same graph (``traced.step``: a flag chooses), so that a model's kernels are one
package: one export, one pass of inductor, one wrapper and one link. The inverse of JᵀJ the
covariance is formed from (``traced.gram_inverse``) does not depend on the model: it is
compiled once per machine, parameter count and chunk, and loaded by every model of that P.

A compiled kernel is specialised to its shapes, dtype, device, thread count, the
tolerances and the model f. It is kept on disk (``_curve.kernel_cache.artifacts``, the user's cache
folder) under a key made of those, of f's fingerprint (``_curve.kernel_cache.fingerprint``: its
code and the values it captures), of the solver's own code and of torch's version, so
that a later process loads it instead of compiling; and in a process-wide cache, so that
a loop of fits loads it once. A chunk with fewer fits than the compiled one (the last
chunk, or the running fits gathered by ``solve_batch``) is padded up to it while it holds
at least ``PAD_SHARE`` of it; below that the fits still running go to a second kernel for
``PAD_SHARE`` of the chunk (when that is at least ``TAIL_FITS``), padded the same way, and
run eagerly when fewer still. A call of one chunk does not repay that second kernel's
compile (its last iterations are a small part of the call): where background builds may
run, it runs its tail eagerly and the tail's kernel is built after it, for later calls.

Under ``compile="auto"`` a kept kernel is always used. A missing one is compiled inline
(saying what, alive and its expected time on stderr: ``progress``) only where the call
repays it: its predicted eager time (``eager_seconds``) exceeds the predicted compile
(``COMPILE_SECONDS``). Else, for a call of at least ``COMPILE_WORK`` elements of J, the
call runs eagerly and, once it ends, a background process forked from it traces and
compiles the graph (``_curve.kernel_cache.background``); a later chunk, call or process loads it. A kernel is built for
``kernel_key.build_threads``, never for the load of the moment, so one kernel serves every
thread count. The eager iteration runs instead, with one ``CompileWarning`` per model,
where the model cannot be traced or compiled (Python control flow on tensor values, such
as ``if x.sum() > 0:``), or no compiler is found (``compile=True`` only: under ``"auto"``
that is silent).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from .._settings import background_build
from .batched_lm import traced
from .batched_lm.driver import BatchData, BatchModel, BatchState, _iterate, start_state
from .batched_lm.traced import data_listed, state_listed
from .batched_lm.unrolled import decompositions
from .kernel_cache import artifacts, background, held, kernel_key
from .kernel_cache.background import Job
from .kernel_cache.held import CACHE_SIZE, PAD_SHARE, TAIL_FITS, forget
from .kernel_cache.progress import CompileProgress, where
from .threads import torch_threads

__all__ = [
    "CACHE_SIZE",
    "COMPILE_MODES",
    "COMPILE_SECONDS",
    "COMPILE_WORK",
    "EAGER_CALL_SECONDS",
    "EAGER_ELEMENT_SECONDS",
    "PAD_SHARE",
    "TAIL_FITS",
    "CompiledIterations",
    "check_compile",
    "compiler_available",
    "eager_seconds",
    "forget",
    "iterations",
]

#: The fit tests as the iteration takes them, ``(FitTests.tolerances(), max_nfev)``: they key
#: its kernel.
Tests = tuple[dict[str, float], int]
#: The values of ``curve_fit_batch``'s ``compile`` keyword.
COMPILE_MODES = ("auto", True, False)
#: Elements of J over all the fits of a call (M·N·P) from which ``compile="auto"`` builds
#: a kernel that is not kept yet (in the background, unless the call repays an inline
#: compile): below it a call is over in milliseconds eagerly, and a compile's minute of a
#: core is not worth spending for it.
COMPILE_WORK = 10_000
#: The predicted seconds of compiling one model's kernels (start and iteration, covariance)
#: on a small CPU (benchmarks/NOTES.md, the compile profile): an inline compile under
#: ``"auto"`` needs a call whose eager time is longer.
COMPILE_SECONDS = 60.0
#: The eager call's predicted seconds: a fixed part (the first iteration's dispatch and
#: allocations) and a part per element of J (M·N·P), fitted to the eager batch calls of
#: benchmarks/NOTES.md (elliptic Gaussian, 36 points, 6 parameters, M = 10⁴ and 10⁵).
EAGER_CALL_SECONDS = 0.4
EAGER_ELEMENT_SECONDS = 1.8e-7


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


def eager_seconds(work: int) -> float:
    """The predicted seconds of an eager call of ``work`` elements of J (M·N·P)."""
    return EAGER_CALL_SECONDS + EAGER_ELEMENT_SECONDS * work


def iterations(
    f: Callable[..., Any],
    mode: str | bool,
    device: torch.device,
    work: int,
    chunk: int,
    fits: int | None = None,
) -> CompiledIterations | None:
    """The iteration for one ``curve_fit_batch`` call, or None for the eager one.

    **Arguments:**

    - ``f``: the model; ``mode``: ``compile`` as checked by ``check_compile``.
    - ``device``: where the fits run; ``work``: M·N·P of the call; ``chunk``: fits per chunk.
    - ``fits``: M (default: ``chunk``), for the work of one chunk.

    **Returns:** None for ``compile=False``; else a ``CompiledIterations`` that uses kept
    kernels and compiles missing ones inline when ``mode`` is True or the call repays it
    (``eager_seconds(work) ≥ COMPILE_SECONDS``), else in the background when ``work`` is at
    least ``COMPILE_WORK``, background builds are on and the fits are on the CPU; a
    compiler must be found (where none is, ``compile=True`` warns once).
    """
    if mode is False:
        return None
    inline = mode is True or eager_seconds(work) >= COMPILE_SECONDS
    background = not inline and work >= COMPILE_WORK and device.type == "cpu" and background_build()
    if (inline or background) and not compiler_available(device):
        if mode is True:
            held.no_compiler(f, device)
        inline = background = False
    chunk_work = work // max(1, fits or chunk) * min(chunk, fits or chunk)
    threads = kernel_key.build_threads(chunk_work, device)
    # A call of one chunk does not repay its tail's kernel (seconds of compile for the
    # last iterations): where background builds may run, that one is built after the call.
    later = inline and (fits or chunk) <= chunk and device.type == "cpu" and background_build()
    return CompiledIterations(
        f, chunk, inline, background=background, threads=threads, tail_later=later
    )


@dataclass
class CompiledIterations:
    """The iteration ``solve_batch`` calls: compiled where it can be, else ``_iterate``.

    One instance serves one ``curve_fit_batch`` call, whose chunks hold ``chunk`` fits (the
    last may hold fewer). A kernel comes from the process-wide cache, else from the disk
    (``_curve.kernel_cache.artifacts``), else it is compiled (for ``chunk`` fits, or the tail's)
    inline when ``may_compile`` (the tail's in a background process instead when
    ``tail_later``), or in a background process when ``background`` (the call runs eagerly
    meanwhile); either builds for ``threads`` torch threads. ``compile_seconds`` is the time this call spent tracing and
    compiling (0 when every kernel was cached or kept); ``compiled`` says whether any
    iteration ran compiled; ``finish`` ends the line announcing a compile on stderr.
    """

    f: Callable[..., Any]
    chunk: int
    may_compile: bool
    background: bool = False
    threads: int = 1
    tail_later: bool = False
    compile_seconds: float = 0.0
    compiled: bool = False
    failed: bool = False
    line: CompileProgress | None = None
    jobs: list[Job] = field(default_factory=list)

    def __call__(
        self,
        model: BatchModel,
        state: BatchState,
        data: BatchData,
        tol: dict[str, float],
        max_nfev: int,
    ) -> BatchState:
        return self._step(model, state, data, (tol, max_nfev), False)

    def start(
        self, model: BatchModel, p0: torch.Tensor, data: BatchData, tests: Tests
    ) -> BatchState:
        """``start_state``, run by the iteration's kernel (its first branch: ``traced.step``)."""
        return self._step(model, traced.blank(p0, data), data, tests, True)

    def _step(
        self,
        model: BatchModel,
        state: BatchState,
        data: BatchData,
        tests: Tests,
        first: bool,
    ) -> BatchState:
        """The start (``first``) or one iteration from ``state``: compiled where a kernel
        serves these fits (padded up to it), else eagerly."""
        fits, (tol, max_nfev) = state.p.shape[0], tests

        def trace(size: int) -> tuple[Callable[..., Any], list[torch.Tensor]]:
            padded, part = held.padded(state, data, size, model)
            run = traced.step(model, data, tol, max_nfev)
            flag = traced.branch(first, state.p.device)
            return run, state_listed(padded) + data_listed(part) + [flag]

        kernel = self._iteration(model, state.p, data, tests, trace)
        if kernel is None and first:
            return start_state(model, state.p, data)
        if kernel is None:
            return _iterate(model, state, data, tol, max_nfev)
        self.compiled = True
        if fits != kernel.fits:
            state, data = held.padded(state, data, kernel.fits, model)
        flag = traced.branch(first, state.p.device)
        out = kernel.run(*state_listed(state), *data_listed(data), flag)
        return BatchState(*(out if fits == kernel.fits else (t[:fits] for t in out)))

    def ready(self, model: BatchModel, p0: torch.Tensor, data: BatchData, tests: Tests) -> bool:
        """Whether the iteration for these fits has a kernel without compiling one: in this
        process's cache, or kept on disk (then loaded and cached for the call), as ``__call__``
        would find it."""
        return self._iteration(model, p0, data, tests, None) is not None

    def _iteration(
        self,
        model: BatchModel,
        p: torch.Tensor,
        data: BatchData,
        tests: Tests,
        trace: Callable[[int], tuple[Callable[..., Any], list[torch.Tensor]]] | None,
    ) -> held.Kernel | None:
        """The iteration's kernel for the fits of ``p``: cached, kept on disk, or compiled
        from ``trace(size)`` (None: only looked for); None where they run eagerly."""
        fits = p.shape[0]
        shapes = kernel_key.shapes(self.f, p, data, *tests, model.x_per_fit)
        kernel = held.serving(shapes, fits)
        size = held.size_for(self.chunk, fits)
        if kernel is not None or not size:
            return kernel
        described = kernel_key.description(self.f, shapes, size, model, p.device)
        built = None if trace is None else (lambda: trace(size))
        return self._kernel(shapes, size, described, p.device, built)

    def gram_inverse(self, gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``traced.gram_inverse`` for the covariance, compiled as the iteration is (a
        kernel for a full chunk, shared by every model of these shapes)."""
        fits = gram.shape[0]
        shapes = ("covariance", None, *gram.shape[1:], gram.dtype, gram.device)
        kernel = held.serving(shapes, fits)
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
    ) -> held.Kernel | None:
        """The kernel for ``shapes`` and ``fits`` fits (``description``: its key's parts,
        None where it has none): kept on disk, or compiled from ``trace()``'s function and
        inputs (inline when ``may_compile``, but for the tail's fits when ``tail_later``;
        in the background when ``background`` or for that tail, then None for now); None:
        run eagerly. Without ``trace`` it only looks (a bad kept kernel
        is left for a call that can rebuild it)."""
        key = None if description is None else artifacts.key_of(description)
        if key is not None and (shapes, fits) in held.ABSENT and background.done(key):
            held.ABSENT.pop((shapes, fits))  # this process's build ended: look again
        looked = (shapes, fits) in held.ABSENT
        inline = self.may_compile and not (self.tail_later and fits < self.chunk)
        later = self.background or (self.may_compile and not inline)
        spawn = later and trace is not None and key not in held.SPAWNED
        if shapes in held.FAILED or (looked and not (inline or spawn)):
            return None
        run, bad = None, key in held.BAD
        if key is not None and not (looked or bad):
            run, bad = artifacts.load(key, device)
            if bad:
                held.BAD.add(key)
        if run is None and not bad:
            held.ABSENT[(shapes, fits)] = None
            while len(held.ABSENT) > 4 * CACHE_SIZE:
                held.ABSENT.popitem(last=False)
        # A kept kernel that cannot be trusted was worth compiling once: it is rebuilt.
        rebuild = bad and compiler_available(device)
        if run is None and trace is not None and (inline or rebuild):
            run = self._build(shapes, key, description or {}, device, trace)
            held.ABSENT.pop((shapes, fits), None)
            held.BAD.discard(key)
        elif run is None and trace is not None and later and key is not None:
            self._in_background(key, description or {}, trace)
        if run is None:
            return None
        kernel = held.Kernel(fits, run, self.f)
        held.CACHE[(shapes, fits)] = kernel
        while len(held.CACHE) > CACHE_SIZE:
            held.CACHE.popitem(last=False)
        return kernel

    def _traced(
        self, trace: Callable[[], tuple[Callable[..., Any], list[torch.Tensor]]]
    ) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
        """The graph of ATen operations ``trace()``'s function runs, and its inputs."""
        run, given = trace()
        # Inputs that share memory (the empty w and mask, views of y) are traced from
        # copies: ``torch.cond``'s branches refuse inputs that alias one another.
        inputs, seen = [], set()
        for tensor in given:
            where = tensor.untyped_storage().data_ptr()
            inputs.append(tensor.clone() if where in seen else tensor)
            seen.add(where)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table = decompositions(inputs[0].shape[-1])
            return make_fx(run, table, tracing_mode="real")(*inputs), inputs

    def _in_background(
        self,
        key: str,
        description: dict[str, Any],
        trace: Callable[[], tuple[Callable[..., Any], list[torch.Tensor]]],
    ) -> None:
        """Queue the background build of ``key`` for the call's end (``finish``; once per
        process and key; not where the key's kept files failed the trust check, or the
        folder may not keep kernels). The builder traces it (a model that cannot be traced
        fails there, said in the builders' log, and runs eagerly here)."""
        if key in held.SPAWNED or key in artifacts.UNTRUSTED:
            return
        held.SPAWNED.add(key)
        if artifacts.writable_folder() is None:
            return
        self.jobs.append(Job(key, description, lambda: self._traced(trace), self.threads))

    def _build(
        self,
        shapes: tuple[Any, ...],
        key: str | None,
        description: dict[str, Any],
        device: torch.device,
        trace: Callable[[], tuple[Callable[..., Any], list[torch.Tensor]]],
    ) -> Callable[..., tuple[torch.Tensor, ...]] | None:
        """Trace and compile ahead of time (for ``threads`` threads), keep the package
        (under ``key``, when there is one) and load it; None (and one warning per model)
        where that fails."""
        line = self._progress(device)
        started = time.perf_counter()

        def build(path: Path) -> None:
            graph, inputs = self._traced(trace)
            with torch_threads(self.threads), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                artifacts.compile_package(graph, inputs, path)

        try:
            with line.alive(str(description.get("kind", "iteration"))):
                return artifacts.save(key, description, build, device)
        except Exception as err:  # any failure means: run eagerly
            self.failed = True
            held.FAILED.add(shapes)
            held.warn_once(self.f, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")
            return None
        finally:
            self.compile_seconds += time.perf_counter() - started

    def _progress(self, device: torch.device) -> CompileProgress:
        """The call's progress line (made at its first inline compile)."""
        if self.line is None:
            name = getattr(self.f, "__qualname__", type(self.f).__name__)
            self.line = CompileProgress(name, where(device, self.threads), COMPILE_SECONDS)
        return self.line

    def finish(self) -> None:
        """End the stderr line of a compile with the time it took (nothing if none), and
        start the background build of the kernels the call traced, now that it is over
        (one process for them all, not competing with the call)."""
        if self.line is not None:
            self.line.finish(self.failed, self.compile_seconds)
        if self.jobs:
            background.start(self.jobs)
            self.jobs = []
