"""How long a new model's kernels take to build with ``compile=True``, and what dominates.

Four models, each in a fresh process, ``curve_fit_batch(..., compile=True)`` on M = 10⁴
fits in float32 (``FITS``, ``DTYPE``): the 5 × 5 and 7 × 7 Gaussian spots
(``marquardt.testing.problems``), the elliptic Gaussian of ``bench_first_call`` (6 × 6
pixels) and an exponential decay (64 points, 3 parameters). A model's own kernel is one
package: f, J and the normal equations at a point (``traced.evaluation``), which serves
the start state and each trial, for the chunk's fits and, where a call's running fits
fall below ``PAD_SHARE`` of them, again for the tail's. The damped attempt, the decision
and the covariance's inverse of JᵀJ do not depend on the model: they are built once per
machine and parameter count P (and chunk), and loaded by every model of that P. Here they
are built first, for each P, in a process of its own (``shared``: a ``compile=True`` call
of a stand-in polynomial of P coefficients whose own evaluation runs eagerly, then its
tails' kernels in the background; the rows "the kernels of no model"), into the pass's
kernel folder; each model's process then finds them there and builds only its own
kernels (the folder holds no kernel of that model). ``compile_s`` is the time the call reports for tracing and
compiling, ``call_s`` the whole first call. The parts are timed in the process by
wrapping the steps it takes (no profiler): ``trace`` (``make_fx``), ``export``
(``torch.export``), ``inductor`` (AOTInductor: code generation and the C++ compiler), of
which ``g++`` (every run of the system compiler, waited on), split into the precompiled
header (built once per machine and torch version, in inductor's own cache folder), the
kernels' code, the wrappers' code (the C++ that calls a package's kernels in turn) and
the links.

Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``) is one fresh folder for each pass,
shared by its processes, as on a machine where the pass's first kernel is the first one
compiled: the first process builds the precompiled header, the later ones reuse it. The
first pass is the package as it is (its wrappers at ``artifacts.WRAPPER_OPT_LEVEL``,
``-O0``); the second (``-O1``, inductor's default) compiles the same kernels, in fresh
processes and folders, with the wrappers at ``-O1``; the best of ``LATER_CALLS`` later
calls of each process's kernels shows what the level costs at run time (the tail's kernel,
built by the background builder, a fresh interpreter, has the package's ``-O0`` wrapper in
both passes).

Target: ≤ 15 s each (``TARGET``), a model's own kernels with the model-independent one
loaded. One process per model and pass, not repeated.

On a GPU (``--device cuda``) the fits and data are on the device, each call's clock stops
after the device has finished, and inductor writes Triton kernels (compiled inside
``inductor``, beside the C++ wrappers' g++ runs); one pass (the package's wrappers) of the
elliptic Gaussian (``GPU_MODELS``), so that it fits a GPU run's few minutes.

``python benchmarks/run_all.py compile_time [--quick] [--device cuda]`` (``--quick``: the
decay alone).
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _machine
import numpy as np
import torch
from _registry import Options
from _rows import row
from bench_first_call import timed_call

from marquardt.testing.problems import decay, gauss2d, spots

MODELS = ("gauss5", "gauss7", "elliptic", "decay")
QUICK_MODELS = ("decay",)
#: The models on a GPU (one pass: ``PASSES[0]``).
GPU_MODELS = ("elliptic",)
#: The wrappers' optimisation in each pass: the package's, then inductor's default.
PASSES = ("O0", "O1")
#: Each model's parameter count P (the model-independent kernel is built once per P).
PARAMS = {"gauss5": 5, "gauss7": 5, "elliptic": 6, "decay": 3}
#: Later calls after the compiling one; the best is the kernels' run time.
LATER_CALLS = 3
FITS = 10_000
DTYPE = "float32"
TARGET = 15.0
CHILD_TIMEOUT = 600.0


def problem(name: str) -> tuple[Callable[..., Any], dict[str, np.ndarray]]:
    """The model ``name`` and its data (``x``, ``y``, ``p0``) for ``FITS`` fits."""
    if name in ("gauss5", "gauss7"):
        data = spots(int(name[-1]), FITS)
        return gauss2d, {k: data[k] for k in ("x", "y", "p0")}
    if name == "elliptic":
        from bench_first_call import elliptic
        from bench_first_call import problem as elliptic_problem

        return elliptic, elliptic_problem(FITS)
    rng = np.random.default_rng(1)
    t = np.linspace(0.0, 10.0, 64)
    true = np.c_[rng.uniform(200, 400, FITS), rng.uniform(0.3, 1.0, FITS), rng.uniform(5, 15, FITS)]
    clean = true[:, :1] * np.exp(-true[:, 1:2] * t) + true[:, 2:]
    y = rng.poisson(clean).astype(np.float64)
    return decay, {"x": t, "y": y, "p0": true * rng.uniform(0.7, 1.3, (FITS, 3))}


class _Clock:
    """Seconds and counts spent in the wrapped steps of one process."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def wrap(self, owner: Any, name: str, part: Callable[..., str] | str) -> None:
        """Time every call of ``owner.name`` under ``part`` (or ``part(*args)``)."""
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            label = part(*args) if callable(part) else part
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - started
                self.counts[label] = self.counts.get(label, 0) + 1

        setattr(owner, name, timed)


def _gxx_part(command: str, cwd: str = "") -> str:
    """What one run of the C++ compiler builds, from its command line."""
    if ".gch" in command or "c++-header" in command:
        return "g++ header"
    if " -shared" in command:
        return "g++ link"
    return "g++ wrapper" if ".wrapper.cpp" in command else "g++ kernels"


def _instrument(level: str) -> _Clock:
    """The clock on the compile's steps, the wrappers compiled at ``level``."""
    import torch._inductor
    from torch._inductor import cpp_builder

    from marquardt.solver._curve import compiled_lm as compiled
    from marquardt.solver._curve.kernel_cache import artifacts

    artifacts.WRAPPER_OPT_LEVEL = level
    clock = _Clock()
    clock.wrap(compiled.CompiledIterations, "_traced", "trace")
    clock.wrap(torch.export, "export", "export")
    clock.wrap(torch._inductor, "aoti_compile_and_package", "inductor")
    clock.wrap(cpp_builder, "_run_compile_cmd", _gxx_part)
    return clock


def process(name: str, level: str, device: str = "cpu") -> dict[str, Any]:
    """One fresh process: compile ``name``'s kernels (``compile=True``) on ``device``, wait
    for the tail's kernel built in the background after the call, then later calls."""
    from marquardt.solver._curve.kernel_cache import artifacts, background

    f, data = problem(name)
    clock = _instrument(level)
    call_s, info = timed_call(f, data, DTYPE, device, compile=True)
    started = time.perf_counter()
    spawned = bool(background._STARTED)
    background.wait()
    waited = time.perf_counter() - started
    later = [timed_call(f, data, DTYPE, device, compile=True) for _ in range(LATER_CALLS)]
    return {
        "call_s": call_s,
        "compile_s": float(info["compile_seconds"]),
        "kernels": int(artifacts.STATS["compiled"]),
        "background_s": waited if spawned else None,
        "later_loaded": int(artifacts.STATS["loaded"]),
        "later_s": min(seconds for seconds, _ in later),
        "later_compiled": all(bool(info["compiled"]) for _, info in later),
        "parts": clock.seconds,
        "counts": clock.counts,
    }


def stand_in(x: torch.Tensor, *p: Any) -> torch.Tensor:
    """A polynomial in x with as many coefficients as parameters: the model whose call
    builds the kernels of no model of its P in ``shared``."""
    return sum(a * x**k for k, a in enumerate(p))  # type: ignore[return-value]


def shared(name: str, level: str, device: str = "cpu") -> dict[str, Any]:
    """One fresh process: build the kernels of no model (the damped attempt, the decision,
    the covariance's inverse of JᵀJ) for ``name``'s P and a chunk of ``FITS`` fits, as the
    first model of that P does: a ``compile=True`` call of ``stand_in`` (P coefficients)
    whose own model's kernel is not built (its evaluation runs eagerly), then the tails'
    kernels built in the background after it."""
    from marquardt.solver._curve import compiled_lm as compiled
    from marquardt.solver._curve.batched_lm import phases
    from marquardt.solver._curve.kernel_cache import artifacts, background

    params = np.shape(problem(name)[1]["p0"])[1]
    x = np.linspace(0.0, 1.0, 16)
    rng = np.random.default_rng(2)
    true = rng.uniform(0.5, 1.5, (FITS, params))
    y = sum(true[:, k : k + 1] * x**k for k in range(params)) + rng.normal(0, 0.01, (FITS, 16))
    clock = _instrument(level)

    def eager(self: Any, model: Any, p: Any, data: Any, look: bool = False) -> Any:
        return functools.partial(phases.evaluate, model, data=data)

    compiled.CompiledIterations._evaluation = eager  # type: ignore[method-assign]
    started = time.perf_counter()
    _, info = timed_call(stand_in, {"x": x, "y": y, "p0": true * 1.1}, DTYPE, device, compile=True)
    call_s = time.perf_counter() - started
    started = time.perf_counter()
    spawned = bool(background._STARTED)
    background.wait()
    return {
        "compile_s": float(info["compile_seconds"]),
        "call_s": call_s,
        "background_s": time.perf_counter() - started if spawned else None,
        "kernels": int(artifacts.STATS["compiled"]),
        "parts": clock.seconds,
        "counts": clock.counts,
    }


def _child_run(
    function: str, args: list[Any], env: dict[str, str], timeout: float
) -> dict[str, Any]:
    import _child

    result, error = _child.call("bench_compile_time", function, args, timeout=timeout, env=env)
    if error:
        raise RuntimeError(f"compile_time {function} {args}: {error}")
    return dict(result)


def _said(result: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.1f} s" for k, v in sorted(result["parts"].items()))


def _pass(models: tuple[str, ...], level: str, device: str, timeout: float) -> list[dict[str, Any]]:
    """One pass (module docstring): the model-independent kernel per P, then each model,
    each process given ``timeout`` seconds."""
    found: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as inductor, tempfile.TemporaryDirectory() as kept:
        env = {**os.environ, "MARQUARDT_CACHE_DIR": kept, "TORCHINDUCTOR_CACHE_DIR": inductor}
        firsts = {PARAMS[name]: name for name in reversed(models)}
        for params, first in sorted(firsts.items()):
            load = _machine.load_average()
            result = _child_run("shared", [first, level, device], env, timeout)
            result.update(model=f"no model P={params}", level=level, load=load, shared=True)
            found.append(result)
            print(
                f"  no model P={params} -{level}: {result['compile_s']:.1f} s; "
                f"{_said(result)}; load {load:.1f}",
                flush=True,
            )
        for name in models:
            load = _machine.load_average()
            result = _child_run("process", [name, level, device], env, timeout)
            result.update(model=name, level=level, load=load, shared=False)
            found.append(result)
            print(
                f"  {name} -{level}: compile {result['compile_s']:.1f} s "
                f"({result['kernels']} kernels), later call {result['later_s']:.3f} s; "
                f"{_said(result)}; load {load:.1f}",
                flush=True,
            )
    return found


def main(
    quick: bool = False, device: str = "cpu", timeout: float = CHILD_TIMEOUT
) -> dict[str, Any]:
    """Every model in both passes (on a GPU: ``GPU_MODELS`` in the first; module
    docstring), each process given ``timeout`` seconds."""
    gpu = torch.device(device).type == "cuda"
    models = QUICK_MODELS if quick else GPU_MODELS if gpu else MODELS
    passes = PASSES[:1] if gpu else PASSES
    machine = _machine.describe(device)
    out: dict[str, Any] = {
        "quick": quick,
        "fits": FITS,
        "dtype": DTYPE,
        "machine": {k: machine[k] for k in ("cpu", "cores", "torch", "gpu") if k in machine},
        "load_before": _machine.load_average(),
        "later_calls": LATER_CALLS,
        "rows": [],
    }
    for level in passes:
        out["rows"] += _pass(models, level, device, timeout)
    out["load_after"] = _machine.load_average()
    return out


def _shared_s(summary: dict[str, Any], r: dict[str, Any]) -> float | None:
    """The seconds the pass of ``r`` spent on the kernels of no model of its P."""
    name = f"no model P={PARAMS.get(r['model'], 0)}"
    for other in summary["rows"]:
        if other.get("shared") and other["model"] == name and other["level"] == r["level"]:
            return float(other["compile_s"])
    return None


def rows(summary: dict[str, Any]) -> list[Any]:
    """Each model's compile time against ``TARGET`` (the package's wrappers; -O1 wrappers
    and the model-independent kernels for information)."""
    found = []
    for r in summary["rows"]:
        parts = r["parts"]
        gxx = sum(v for k, v in parts.items() if k.startswith("g++"))
        steps = (
            f"trace {parts.get('trace', 0):.1f} s, export {parts.get('export', 0):.1f} s, "
            f"inductor {parts.get('inductor', 0):.1f} s of which g++ {gxx:.1f} s"
        )
        if r.get("shared"):
            found.append(
                row(
                    f"compile_time {r['model']} (the kernels of no model: the damped attempt, "
                    f"the decision, the covariance's inverse of JᵀJ; {summary['fits']:,} fits, "
                    f"{summary['dtype']}, wrappers at -{r['level']}): built once per machine "
                    "and P",
                    r["compile_s"],
                    None,
                    unit=" s",
                    detail=f"{r['kernels']} packages inline; {steps}; the tails' kernels "
                    f"built in the background after the call: {r.get('background_s') or 0:.1f} "
                    f"s; load {r['load']:.1f}",
                )
            )
            continue
        covariance = _shared_s(summary, r)
        loaded = (
            "the kernels of no model loaded (built once per P"
            + (f": {covariance:.1f} s" if covariance is not None else "")
            + ")"
            if "shared" in r
            else "the kernels of no model included"
        )
        found.append(
            row(
                f"compile_time {r['model']} ({summary['fits']:,} fits, {summary['dtype']}, "
                f"wrappers at -{r['level']}): compile=True first call's compile",
                r["compile_s"],
                TARGET if r["level"] == PASSES[0] else None,
                unit=" s",
                detail=f"{r['kernels']} package{'s' if r['kernels'] != 1 else ''}; {steps}; "
                f"{loaded}; {_background(r)}"
                f"{_later(summary)} {r['later_s']:.3f} s; load {r['load']:.1f}",
            )
        )
    return found


def _background(r: dict[str, Any]) -> str:
    """What the process waited for after the call: the tail's kernel built in the background."""
    seconds = r.get("background_s")
    if seconds is None:
        return "no background build; "
    return f"the tail's kernel built in the background after the call: {seconds:.1f} s; then "


def _later(summary: dict[str, Any]) -> str:
    """What the later-call figure is (a record before ``LATER_CALLS`` holds one call)."""
    calls = int(summary.get("later_calls", 1))
    return "later call" if calls == 1 else f"best of {calls} later calls"


def section(summary: dict[str, Any]) -> str:
    """The runs as a Markdown table, with the machine."""
    machine = summary["machine"]
    head = ["model", "wrappers", "packages", "compile (s)", "trace", "export", "inductor"]
    head += ["of it g++", "g++: header / kernels / wrappers / links"]
    head += ["tail in the background (s)", f"{_later(summary)} (s)", "load"]
    gpu = (
        f"GPU {machine['gpu']} (inductor's Triton kernels compiled inside `inductor`); "
        if machine.get("gpu")
        else ""
    )
    lines = [
        f"{gpu}CPU {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}; "
        f"{summary['fits']:,} fits, {summary['dtype']}, `compile=True`, each a fresh process; "
        "the kernels of no model (the damped attempt's, the decision's, the covariance's) built "
        "first for each P, in its own process (a stand-in's call), and loaded by the models' "
        "processes; inductor's cache folder fresh for each "
        "pass (its first process builds the precompiled header). Seconds; one process each, "
        "not repeated.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in summary["rows"]:
        p = r["parts"]
        gxx = [p.get(f"g++ {k}", 0.0) for k in ("header", "kernels", "wrapper", "link")]
        cells = [
            r["model"],
            f"-{r['level']}",
            str(r.get("kernels", "")),
            f"{r['compile_s']:.1f}",
            f"{p.get('trace', 0):.1f}",
            f"{p.get('export', 0):.1f}",
            f"{p.get('inductor', 0):.1f}",
            f"{sum(gxx):.1f}",
            " / ".join(f"{v:.1f}" for v in gxx),
            "—" if r.get("background_s") is None else f"{r['background_s']:.1f}",
            f"{r['later_s']:.3f}" if "later_s" in r else "—",
            f"{r['load']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it (``--budget``: the seconds each process
    may take, ``CHILD_TIMEOUT`` without it)."""
    return main(quick=o.quick, device=o.device, timeout=o.budget or CHILD_TIMEOUT)
