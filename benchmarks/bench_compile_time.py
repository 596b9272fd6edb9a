"""How long a new model's kernels take to build with ``compile=True``, and what dominates.

Four models, each in a fresh process with an empty kernel folder (``MARQUARDT_CACHE_DIR``),
``curve_fit_batch(..., compile=True)`` on M = 10⁴ fits in float32 (``FITS``, ``DTYPE``):
the 5 × 5 and 7 × 7 Gaussian spots (``marquardt.testing.problems``), the elliptic
Gaussian of ``bench_first_call`` (6 × 6 pixels) and an exponential decay (64 points, 3
parameters). The call compiles three kernels (the start state, the iteration, the
covariance's inverse); ``compile_s`` is the time the call reports for tracing and
compiling them, ``call_s`` the whole first call. The parts are timed in the process by
wrapping the steps it takes (no profiler): ``trace`` (``make_fx`` of the three functions),
``export`` (``torch.export``), ``inductor`` (AOTInductor: code generation and the C++
compiler), of which ``g++`` (every run of the system compiler, waited on), split into the
precompiled header (built once per machine and torch version, in inductor's own cache
folder, where it is a run of its own), the kernels' code, the wrappers' code (the C++ that
calls a package's kernels in turn) and the links.

Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``) is one fresh folder for each pass,
shared by its processes, as on a machine where the pass's first model is the first one
compiled: the first process builds the precompiled header, the later ones reuse it (and
the covariance kernel, the same for models of one P, where inductor finds it). The first
pass (``wrapper -O1``) is the package as it is (``artifacts.WRAPPER_OPT_LEVEL``, inductor's
default); the second (``wrapper -O0``) compiles the same four models, in fresh processes
and folders, with the wrappers at ``-O0``, to show what that would save; the best of
``LATER_CALLS`` later calls of each process's kernels shows what it costs at run time.

Target: ≤ 15 s each (``TARGET``). One process per model and pass, not repeated.

On a GPU (``--device cuda``) the fits and data are on the device, each call's clock stops
after the device has finished, and inductor writes Triton kernels (compiled inside
``inductor``, beside the C++ wrappers' g++ runs); one pass (the package's wrappers) of the
elliptic Gaussian (``GPU_MODELS``), so that it fits a GPU run's few minutes.

``python benchmarks/run_all.py compile_time [--quick] [--device cuda]`` (``--quick``: the
decay alone).
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import _common as c
import _machine
import numpy as np
import torch
from _registry import Options
from _rows import row

from marquardt.testing.problems import decay, gauss2d, spots

MODELS = ("gauss5", "gauss7", "elliptic", "decay")
QUICK_MODELS = ("decay",)
#: The models on a GPU (one pass: ``PASSES[0]``).
GPU_MODELS = ("elliptic",)
#: The wrappers' optimisation in each pass: the package's, then the cheaper one.
PASSES = ("O1", "O0")
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


def _call(
    f: Callable[..., Any], data: dict[str, np.ndarray], device: str, **options: Any
) -> tuple[float, Any]:
    """One call on ``device`` and its seconds (until the device has finished), its info."""
    from marquardt.solver import curve_fit_batch

    kind, where = getattr(torch, DTYPE), torch.device(device)
    x, y, p0 = (torch.from_numpy(np.asarray(data[k])).to(where, kind) for k in ("x", "y", "p0"))
    c.synchronize(where)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.perf_counter()
        _, _, info = curve_fit_batch(f, x, y, p0, full_output=True, **options)
        c.synchronize(where)
    return time.perf_counter() - started, info


def process(name: str, level: str, device: str = "cpu") -> dict[str, Any]:
    """One fresh process: compile ``name``'s kernels (``compile=True``) on ``device``, then
    later calls."""
    from marquardt.solver._curve.kernel_cache import artifacts

    f, data = problem(name)
    clock = _instrument(level)
    call_s, info = _call(f, data, device, compile=True)
    later = [_call(f, data, device, compile=True) for _ in range(LATER_CALLS)]
    return {
        "call_s": call_s,
        "compile_s": float(info["compile_seconds"]),
        "kernels": int(artifacts.STATS["compiled"]),
        "later_s": min(seconds for seconds, _ in later),
        "later_compiled": all(bool(info["compiled"]) for _, info in later),
        "parts": clock.seconds,
        "counts": clock.counts,
    }


def main(
    quick: bool = False, device: str = "cpu", timeout: float = CHILD_TIMEOUT
) -> dict[str, Any]:
    """Every model in both passes (on a GPU: ``GPU_MODELS`` in the first; module
    docstring), each process given ``timeout`` seconds."""
    import _child

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
        with tempfile.TemporaryDirectory() as inductor:
            for name in models:
                with tempfile.TemporaryDirectory() as kept:
                    env = {**os.environ, "MARQUARDT_CACHE_DIR": kept}
                    env["TORCHINDUCTOR_CACHE_DIR"] = inductor
                    load = _machine.load_average()
                    result, error = _child.call(
                        "bench_compile_time",
                        "process",
                        [name, level, device],
                        timeout=timeout,
                        env=env,
                    )
                if error:
                    raise RuntimeError(f"compile_time {name} {level}: {error}")
                result.update(model=name, level=level, load=load)
                out["rows"].append(result)
                print(
                    f"  {name} -{level}: compile {result['compile_s']:.1f} s "
                    f"({result['kernels']} kernels), later call {result['later_s']:.3f} s; "
                    + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(result["parts"].items()))
                    + f"; load {load:.1f}",
                    flush=True,
                )
    out["load_after"] = _machine.load_average()
    return out


def rows(summary: dict[str, Any]) -> list[Any]:
    """Each model's compile time against ``TARGET`` (the package's wrappers; -O0 wrappers
    for information)."""
    found = []
    for r in summary["rows"]:
        parts = r["parts"]
        gxx = sum(v for k, v in parts.items() if k.startswith("g++"))
        found.append(
            row(
                f"compile_time {r['model']} ({summary['fits']:,} fits, {summary['dtype']}, "
                f"wrappers at -{r['level']}): compile=True first call's compile",
                r["compile_s"],
                TARGET if r["level"] == PASSES[0] else None,
                unit=" s",
                detail=f"trace {parts.get('trace', 0):.1f} s, export {parts.get('export', 0):.1f} s, "
                f"inductor {parts.get('inductor', 0):.1f} s of which g++ {gxx:.1f} s; "
                f"{_later(summary)} {r['later_s']:.3f} s; load {r['load']:.1f}",
            )
        )
    return found


def _later(summary: dict[str, Any]) -> str:
    """What the later-call figure is (a record before ``LATER_CALLS`` holds one call)."""
    calls = int(summary.get("later_calls", 1))
    return "later call" if calls == 1 else f"best of {calls} later calls"


def section(summary: dict[str, Any]) -> str:
    """The runs as a Markdown table, with the machine."""
    machine = summary["machine"]
    head = ["model", "wrappers", "compile (s)", "trace", "export", "inductor", "of it g++"]
    head += ["g++: header / kernels / wrappers / links", f"{_later(summary)} (s)", "load"]
    gpu = (
        f"GPU {machine['gpu']} (inductor's Triton kernels compiled inside `inductor`); "
        if machine.get("gpu")
        else ""
    )
    lines = [
        f"{gpu}CPU {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}; "
        f"{summary['fits']:,} fits, {summary['dtype']}, `compile=True`, each a fresh process with "
        "an empty kernel folder; inductor's cache folder fresh for each pass (its first process "
        "builds the precompiled header). Seconds; one process each, not repeated.",
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
            f"{r['compile_s']:.1f}",
            f"{p.get('trace', 0):.1f}",
            f"{p.get('export', 0):.1f}",
            f"{p.get('inductor', 0):.1f}",
            f"{sum(gxx):.1f}",
            " / ".join(f"{v:.1f}" for v in gxx),
            f"{r['later_s']:.3f}",
            f"{r['load']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it (``--budget``: the seconds each process
    may take, ``CHILD_TIMEOUT`` without it)."""
    return main(quick=o.quick, device=o.device, timeout=o.budget or CHILD_TIMEOUT)
