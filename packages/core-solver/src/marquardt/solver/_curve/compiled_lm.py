"""Fused kernels for ``curve_fit_batch``: one batched LM iteration, compiled once per machine.

One eager iteration of ``_curve.batched_lm.driver`` is dozens of small kernels, each a
pass over memory and a dispatch. Here each phase of the iteration (``_curve.batched_lm.phases``) is
traced to one graph of ATen operations (``make_fx``, which also unrolls ``vmap``/``jacfwd``;
the traced functions are ``_curve.batched_lm.traced``) and compiled ahead of time by
AOTInductor (C++/OpenMP through the system compiler on CPUs, Triton on GPUs), so that the
pointwise work and the reductions over the N points run fused; the P × P Cholesky
factorisations and solves are traced written out (``_curve.batched_lm.unrolled``) so that
they fuse too, instead of one LAPACK call per fit. Three kernels run an iteration:

* the model's (``traced.evaluation``): f, J, the residuals and the reductions into J̃ᵀJ̃ and
  J̃ᵀr̃ at a point, which serves the start state too;
* the damped attempt's (``traced.attempting``) and the decision's (``traced.deciding``),
  which read one value, vector or matrix per fit only: they depend neither on the model
  nor on N, so one of each is compiled per machine, parameter count, dtype and chunk, and
  loaded by every model of that P, as the covariance's inverse of JᵀJ
  (``traced.gram_inverse``) is.

A new model compiles its own small graph only once those of its P are kept. Where the
model's kernel does not serve a chunk, its iteration runs eagerly, whatever the others.

A compiled kernel is specialised to its shapes, dtype, device and what it bakes in (the
model f and its losses; the tolerances and budget for the attempt and the decision). It is
kept on disk (``_curve.kernel_cache.artifacts``, the user's cache
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
repays it: its predicted eager time (``eager_seconds``) is ``INLINE_MARGIN`` times the
predicted compile (``COMPILE_SECONDS``). Else, for a call of at least ``COMPILE_WORK`` elements of J, the
call runs eagerly and, once it ends, a background process forked from it traces and
compiles the graph (``_curve.kernel_cache.background``); a later chunk, call or process loads it. A kernel is built for
``kernel_key.build_threads``, never for the load of the moment, so one kernel serves every
thread count. The eager iteration runs instead, with one ``CompileWarning`` per model,
where the model cannot be traced or compiled (Python control flow on tensor values, such
as ``if x.sum() > 0:``), or no compiler is found (``compile=True`` only: under ``"auto"``
that is silent).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from .._settings import background_build
from .batched_lm import phases, traced
from .batched_lm.state import BatchData, BatchModel, BatchState
from .batched_lm.traced import data_listed
from .batched_lm.unrolled import decompositions
from .compile_policy import (
    COMPILE_SECONDS,
    COMPILE_WORK,
    INLINE_MARGIN,
    check_compile,
    compiler_available,
    eager_seconds,
)
from .kernel_cache import artifacts, background, held, kernel_key
from .kernel_cache.background import Job
from .kernel_cache.held import CACHE_SIZE, PAD_SHARE, TAIL_FITS, forget
from .kernel_cache.progress import CompileProgress, where
from .threads import torch_threads

__all__ = [
    "CACHE_SIZE",
    "COMPILE_SECONDS",
    "COMPILE_WORK",
    "PAD_SHARE",
    "TAIL_FITS",
    "CompiledIterations",
    "check_compile",
    "compiler_available",
    "eager_seconds",
    "forget",
    "iterations",
]


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
    (``eager_seconds(work) ≥ INLINE_MARGIN · COMPILE_SECONDS``), else in the background when ``work`` is at
    least ``COMPILE_WORK``, background builds are on and the fits are on the CPU; a
    compiler must be found (where none is, ``compile=True`` warns once).
    """
    if mode is False:
        return None
    inline = mode is True or eager_seconds(work) >= INLINE_MARGIN * COMPILE_SECONDS
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
    """The iteration ``solve_batch`` calls: compiled where it can be, else ``phases.iterate``.

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
        """One iteration (``phases.iterate``): where the model's kernel serves these fits
        (padded up to it), each phase by its kernel (the attempt's and the decision's
        eagerly where theirs are missing); else eagerly (and where the model's kernel is
        built in the background, by this call or an earlier one of the process, the
        attempt's and the decision's for these tolerances are queued with it)."""
        evaluation = self._evaluation(model, state.p, data)
        if evaluation is None and not (self.jobs or self.background):
            return phases.iterate(model, state, data, tol, max_nfev)
        if evaluation is None:  # the model's kernel is on its way: the phases' go with it
            evaluation = functools.partial(phases.evaluate, model, data=data)
        size2 = phases.squares(state, data)
        bounds = (data.lower, data.upper)
        listed = traced.fits_listed(state)
        gtol, where = tol["gtol"], state.p.device
        shapes = kernel_key.free_shapes("attempt", state.p, (gtol, max_nfev))
        given = held.rows([*listed, size2, *bounds])
        out = self._run(shapes, given, lambda: traced.attempting(gtol, max_nfev), where)
        if out is None:
            a = phases.attempt(state, size2, bounds, gtol, max_nfev)
        else:
            a = phases.Attempt(*out)
        e = evaluation(a.trial)
        linear = data.losses == ("linear",)
        shapes = kernel_key.free_shapes("decide", state.p, (tuple(sorted(tol.items())), linear))
        given = held.rows(
            [*listed, a.trial, a.step, a.solved, a.status, e.cost, e.gram, e.g, e.finite, size2]
        )
        out = self._run(shapes, given, lambda: traced.deciding(tol, linear), where)
        if out is None:
            new, accept = phases.decide(state, a, e, size2, tol, linear)
        else:
            new, accept = traced.fits_built(out[:-1], state), out[-1]
        return phases.kept(new, state, e, accept, data)

    def start(self, model: BatchModel, p0: torch.Tensor, data: BatchData) -> BatchState:
        """``start_state``: the model's kernel (or ``phases.evaluate``) at p0 clipped into
        the bounds, then ``phases.begin``."""
        p = torch.clamp(p0, data.lower, data.upper)
        evaluation = self._evaluation(model, p, data)
        e = phases.evaluate(model, p, data) if evaluation is None else evaluation(p)
        return phases.begin(p, e, data)

    def _evaluation(
        self, model: BatchModel, p: torch.Tensor, data: BatchData, look: bool = False
    ) -> Callable[[torch.Tensor], phases.Evaluation] | None:
        """``phases.evaluate`` for fits of ``p``'s shape, by the model's kernel (cached,
        kept, or compiled; only looked for when ``look``); None where none serves them."""
        fits = p.shape[0]
        shapes = kernel_key.shapes(self.f, p, data, model.x_per_fit)

        def at(point: torch.Tensor) -> Callable[[int | None], list[torch.Tensor]]:
            def inputs(size: int | None) -> list[torch.Tensor]:
                index = held.padding(fits, size, point.device)
                part = data if index is None else data.take(index, model.x_per_fit)
                return [point if index is None else point[index], *data_listed(part)]

            return inputs

        def describe(size: int) -> dict[str, Any] | None:
            return kernel_key.description(self.f, shapes, size, model, p.device)

        def function() -> Callable[..., tuple[torch.Tensor, ...]]:
            return traced.evaluation(model, data)

        kernel = self._find(shapes, at(p), None if look else function, p.device, describe)
        if kernel is None:
            return None

        def run(point: torch.Tensor) -> phases.Evaluation:
            self.compiled = True
            return phases.Evaluation(*self._apply(kernel, at(point), fits))

        return run

    def ready(self, model: BatchModel, p0: torch.Tensor, data: BatchData) -> bool:
        """Whether the model's kernel for these fits is at hand without compiling one: in
        this process's cache, or kept on disk (then loaded and cached for the call), as a
        call would find it."""
        return self._evaluation(model, p0, data, look=True) is not None

    def _run(
        self,
        shapes: tuple[Any, ...],
        inputs: Callable[[int | None], list[torch.Tensor]],
        function: Callable[[], Callable[..., tuple[torch.Tensor, ...]]],
        device: torch.device,
    ) -> tuple[torch.Tensor, ...] | None:
        """``function()`` of a kernel of no model run by its kernel for ``shapes`` on
        ``inputs`` (``_find``); None where the fits run eagerly."""
        kernel = self._find(shapes, inputs, function, device)
        return None if kernel is None else self._apply(kernel, inputs, inputs(None)[0].shape[0])

    def _find(
        self,
        shapes: tuple[Any, ...],
        inputs: Callable[[int | None], list[torch.Tensor]],
        function: Callable[[], Callable[..., tuple[torch.Tensor, ...]]] | None,
        device: torch.device,
        describe: Callable[[int], dict[str, Any] | None] | None = None,
    ) -> held.Kernel | None:
        """The kernel of ``function()`` for ``shapes`` and the fits of ``inputs(None)``
        (``inputs(size)``: their tensors padded to ``size`` fits): cached, kept on disk,
        or compiled (None for ``function``: only looked for); None where they run
        eagerly. ``describe(size)`` gives the kernel key's parts (default:
        ``kernel_key.free``'s, for a kernel of no model)."""
        fits = inputs(None)[0].shape[0]
        kernel = held.serving(shapes, fits)
        size = held.size_for(self.chunk, fits)
        if kernel is not None or not size:
            return kernel
        described = describe(size) if describe else kernel_key.free(shapes, size, device)
        trace = None
        if function is not None:

            def trace() -> tuple[Callable[..., Any], list[torch.Tensor]]:
                return function(), inputs(size)

        return self._kernel(shapes, size, described, device, trace)

    def _apply(
        self, kernel: held.Kernel, inputs: Callable[[int | None], list[torch.Tensor]], fits: int
    ) -> tuple[torch.Tensor, ...]:
        """``kernel`` run on ``inputs`` padded to its fits; the first ``fits`` of each output."""
        out = kernel.run(*inputs(kernel.fits))
        return out if fits == kernel.fits else tuple(t[:fits] for t in out)

    def gram_inverse(self, gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``traced.gram_inverse`` for the covariance, compiled as the iteration is (a
        kernel for a full chunk, shared by every model of these shapes)."""
        fits = gram.shape[0]
        shapes = kernel_key.free_shapes("covariance", gram[:, 0], ())  # a row per fit: P
        kernel = held.serving(shapes, fits)
        if kernel is None and fits == self.chunk:

            def trace() -> tuple[Callable[..., Any], list[torch.Tensor]]:
                return traced.gram_inverse, [gram]

            described = kernel_key.free(shapes, fits, gram.device)
            kernel = self._kernel(shapes, fits, described, gram.device, trace)
        if kernel is None:
            return traced.gram_inverse(gram)
        out, good = kernel.run(*held.rows([gram])(kernel.fits))
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
        # copies, so that the exported graph's inputs are distinct buffers.
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
