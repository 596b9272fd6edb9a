"""Single small fits as a SciPy user runs them: ours against scipy.optimize.curve_fit and JAXFit.

The same data, p0 and float64 on every side; NumPy data in, as SciPy takes it:

* exponential decay a·exp(−b·x) + c (P = 3), N = 100, x in [0, 4];
* Gaussian plus offset (``bench_curve_fit``'s problem, P = 4), N = 10³, 10⁴, 10⁵, 10⁶.

Each case is measured (``measure``) in a fresh process, twice, one process after the
other (``_child.call``), as a scientist runs the same script twice: both processes use the
user's cache folder as it is (``MARQUARDT_CACHE_DIR`` or the platform's, whatever the
benchmark runs under), so the second finds what the first left there. The second process
gives the row's figures; the first process's first calls are shown beside them. On a GPU
(``--device cuda``) each case runs in one process, to fit the driver's short window. In each
process, sides interleaved, each side's first call is timed apart (torch model first, so
that its first call is the process's first fit), then ``WARM_CALLS`` more, then the median
of ``REPEATS`` calls from the tenth on:

* ours, torch model: ``marquardt.solver.curve_fit`` with the model written with torch
  operations (autodiff), default arguments (``compile`` and threads included), and again
  with one thread (the default must never be slower);
* ours, NumPy model: ``marquardt.solver.curve_fit`` with f written with NumPy (finite
  differences), default arguments;
* ours, torch model, ``compile=True``: the fit through the compiled core
  (``_curve.batch_of_one``): the first process compiles its kernels (its first
  call), the second loads them (no target: what a kept kernel gives). The model is a
  wrapper of its own, so that its kernels are keyed apart from the default side's: the
  default rows show what a script that passes no keyword gets;
* SciPy: ``scipy.optimize.curve_fit(f, x, y, p0)`` with its defaults ("lm": MINPACK's
  lmdif, finite differences), f written with NumPy;
* JAXFit (``CurveFit().curve_fit``, the JAX-compiled SciPy-compatible ``curve_fit``, its
  model in ``jax.numpy``), on the CPU, in a process of the interpreter named by
  ``JAXFIT_PYTHON`` (``_jaxfit_side.py``; JAXFit pins JAX, NumPy and SciPy versions of its
  own, so it lives in an environment of its own) on the same x, y, p0: its first call
  (it compiles per data length), then the tenth-call median. Without ``JAXFIT_PYTHON``,
  or when its run fails, the JAXFit columns say why and everything else runs.

Targets, ours (tenth call of the second process) / SciPy, torch and NumPy models: ≤ 3× at
N = 100, ≤ 1.5× at 10³, ≤ 1× at 10⁴, ≤ 0.5× from 10⁵ on, and the same for ours' first
call in the second process against SciPy's first call there; default threads / one thread
≤ 1. First calls and JAXFit are reported beside. ``JAXFIT_PYTHON=PATH python
benchmarks/run_all.py small_fit [--quick] [--device cuda]`` (``cuda``: ours' torch-model
side gets its data on the GPU; JAXFit stays on the CPU). A JAXFit environment:
``python3 -m venv VENV && VENV/bin/pip install jaxfit==0.0.5 jax==0.4.20 jaxlib==0.4.20
"numpy<2" "scipy<1.12"``, then ``JAXFIT_PYTHON=VENV/bin/python``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _child
import _common as c
import _machine
import numpy as np
import torch
from _registry import Options
from _rows import Row, row

from marquardt.testing.problems import decay, decay_numpy, gaussian, gaussian_numpy

CASES = (
    ("decay", 100),
    ("gaussian", 1_000),
    ("gaussian", 10_000),
    ("gaussian", 100_000),
    ("gaussian", 1_000_000),
)
QUICK_CASES = (("decay", 100), ("gaussian", 1_000), ("gaussian", 10_000))
REPEATS = 5
QUICK_REPEATS = 3
TARGETS = {100: 3.0, 1_000: 1.5, 10_000: 1.0}
TARGET_LARGE = 0.5
THREADS_TARGET = 1.0
#: Calls of each side after the first and before the timed ones (timing starts at the tenth).
WARM_CALLS = 8
#: Seconds one process of one case may take (its first fits may compile).
CHILD_TIMEOUT = 900.0
#: The interpreter of a JAXFit install (module docstring).
JAXFIT_ENV = "JAXFIT_PYTHON"
#: The processes each case runs in, in order (module docstring).
PROCESSES = ("first_process", "second_process")

DECAY_TRUE, DECAY_P0 = (2.5, 1.3, 0.5), (1.0, 1.0, 0.0)
GAUSS_TRUE, GAUSS_P0 = (2.0, 0.3, 0.8, 0.5), (1.0, 0.0, 1.0, 0.0)


def problem(
    name: str, n: int
) -> tuple[Callable[..., Any], Callable[..., Any], np.ndarray, np.ndarray, tuple[float, ...]]:
    rng = np.random.default_rng(c.SEED)
    if name == "decay":
        x = np.linspace(0.0, 4.0, n)
        y = decay_numpy(x, *DECAY_TRUE) + 0.02 * rng.standard_normal(n)
        return decay_numpy, decay, x, y, DECAY_P0
    x = np.linspace(-5.0, 5.0, n)
    y = gaussian_numpy(x, *GAUSS_TRUE) + 0.05 * rng.standard_normal(n)
    return gaussian_numpy, gaussian, x, y, GAUSS_P0


def _timed(call: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def measure(name: str, n: int, repeats: int, device: str) -> dict[str, Any]:
    """One case in this process (run by ``_child``, module docstring): every side's first
    call, then the medians of ``repeats`` interleaved calls from the tenth on."""
    from scipy.optimize import curve_fit as scipy_curve_fit

    from marquardt.solver import curve_fit

    where = torch.device(device)
    f_np, f_t, x, y, p0 = problem(name, n)
    default_threads = torch.get_num_threads()
    xt, yt = (torch.from_numpy(x).to(where), torch.from_numpy(y).to(where))
    torch_x, torch_y = (x, y) if where.type == "cpu" else (xt, yt)

    def as_numpy(p: Any) -> np.ndarray:
        return p.cpu().numpy() if isinstance(p, torch.Tensor) else np.asarray(p)

    def scipy() -> np.ndarray:
        return scipy_curve_fit(f_np, x, y, list(p0))[0]

    def ours_numpy() -> np.ndarray:
        return curve_fit(f_np, x, y, list(p0))[0]

    def ours_torch() -> np.ndarray:
        out = as_numpy(curve_fit(f_t, torch_x, torch_y, list(p0))[0])
        c.synchronize(where)
        return out

    # Its own model object and code: the kernels compile=True keeps are not the default
    # side's (a kernel is keyed by the model's code), so the default rows stay default.
    def twin(x: Any, *p: Any) -> Any:
        return f_t(x, *p)

    def ours_torch_compiled() -> np.ndarray:
        out = as_numpy(curve_fit(twin, torch_x, torch_y, list(p0), compile=True)[0])
        c.synchronize(where)
        return out

    def ours_torch_one_thread() -> np.ndarray:
        torch.set_num_threads(1)
        try:
            return ours_torch()
        finally:
            torch.set_num_threads(default_threads)

    sides = {
        "ours_torch_model": ours_torch,
        "ours_numpy_model": ours_numpy,
        "scipy": scipy,
        "ours_torch_model_1_thread": ours_torch_one_thread,
        "ours_torch_model_compiled": ours_torch_compiled,
    }
    load_before = _machine.load_average()
    seconds: dict[str, list[float]] = {k: [] for k in sides}
    popt: dict[str, list[float]] = {}
    first: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, call in sides.items():
            first[key] = _timed(call)[0]
        for _ in range(WARM_CALLS):
            for call in sides.values():
                call()
        for _ in range(repeats):
            for key, call in sides.items():
                t, p = _timed(call)
                seconds[key].append(t)
                popt[key] = [float(v) for v in p]
    med = {k: statistics.median(v) for k, v in seconds.items()}
    return {
        "case": name,
        "n": n,
        "repeats": repeats,
        "median": med,
        "first_call": first,
        "popt": popt,
        "threads_default": default_threads,
        "load_before": load_before,
        "load_after": _machine.load_average(),
    }


def jaxfit(name: str, n: int, repeats: int) -> dict[str, Any]:
    """JAXFit on the case's data, in a process of ``JAXFIT_PYTHON`` (``_jaxfit_side``).

    **Returns:** its ``first_call``, ``median``, ``popt`` and versions, or ``error``
    saying why there are none.
    """
    python = os.environ.get(JAXFIT_ENV, "").strip()
    if not python:
        return {"error": f"{JAXFIT_ENV} not set"}
    _, _, x, y, p0 = problem(name, n)
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "case.npz"
        np.savez(data, x=x, y=y, p0=np.asarray(p0, dtype=np.float64))
        try:
            result, error = _child.call(
                "_jaxfit_side",
                "measure",
                [str(data), name, WARM_CALLS, repeats],
                timeout=CHILD_TIMEOUT,
                launcher=[python],
            )
        except OSError as exc:  # not an interpreter
            result, error = None, str(exc)
    return result if error == "" else {"error": f"{JAXFIT_ENV}={python}: {error}"}


def _agreement(popt: dict[str, list[float]], reference: list[float]) -> dict[str, float]:
    """Each side's largest relative difference of popt to ``reference`` (SciPy's)."""
    ref = np.asarray(reference)
    return {k: float(np.max(np.abs(np.asarray(v) - ref) / np.abs(ref))) for k, v in popt.items()}


def case(name: str, n: int, repeats: int, device: str) -> dict[str, Any]:
    """One case: ``measure`` in a first and a second process, and JAXFit; the second
    process's figures at the top level, the first's under ``first_process``."""
    runs: dict[str, Any] = {}
    # On a GPU one process (the driver's short window; the first-run costs are the CPU's).
    for process in PROCESSES if device == "cpu" else PROCESSES[1:]:
        result, error = _child.call(
            "bench_small_fit", "measure", [name, n, repeats, device], timeout=CHILD_TIMEOUT
        )
        if error:
            raise RuntimeError(f"small_fit {name} N={n}, {process.replace('_', ' ')}: {error}")
        runs[process] = result
    out = runs["second_process"]
    med, popt = out["median"], out.pop("popt")
    peer = jaxfit(name, n, repeats)
    if "popt" in peer:
        popt["jaxfit"] = peer.pop("popt")
    out["ratios"] = {
        "numpy_model_vs_scipy": med["ours_numpy_model"] / med["scipy"],
        "torch_model_vs_scipy": med["ours_torch_model"] / med["scipy"],
        "default_vs_one_thread": med["ours_torch_model"] / med["ours_torch_model_1_thread"],
    }
    if "ours_torch_model_compiled" in med:
        out["ratios"]["compiled_vs_scipy"] = med["ours_torch_model_compiled"] / med["scipy"]
    if "median" in peer:
        out["ratios"]["jaxfit_vs_scipy"] = peer["median"] / med["scipy"]
    out["max_relative_popt_difference_to_scipy"] = _agreement(popt, popt["scipy"])
    if "first_process" in runs:
        out["first_process"] = {
            k: runs["first_process"][k]
            for k in ("median", "first_call", "load_before", "load_after")
        }
    out["jaxfit"] = peer
    return out


def main(quick: bool = False, device: str = "cpu") -> dict[str, Any]:
    where = torch.device(device)
    results: dict[str, Any] = {
        "problem": "single fits, float64, NumPy data in; decay a·exp(−b·x) + c (P = 3) and "
        "Gaussian plus offset (P = 4)",
        "device": str(where),
        "quick": quick,
        "machine": {k: v for k, v in _machine.describe().items() if k in ("cpu", "cores", "torch")},
        "cases": [],
    }
    for name, n in QUICK_CASES if quick else CASES:
        results["cases"].append(case(name, n, QUICK_REPEATS if quick else REPEATS, str(where)))
    return results


def _ms(value: float | None) -> str:
    """A duration in milliseconds with the digits a sub-millisecond fit needs."""
    return "—" if value is None else f"{value * 1e3:.3g} ms"


def _first_calls(e: dict[str, Any], process: str) -> dict[str, float]:
    """The first calls of ``process`` (``PROCESSES``); none for a record of one process."""
    if "first_process" not in e:
        return {}
    return e["first_call"] if process == "second_process" else e[process]["first_call"]


def _pair(first: dict[str, float]) -> str:
    """The NumPy and torch models' first calls, "NumPy / torch"."""
    return " / ".join(_ms(first.get(f"ours_{k}_model")) for k in ("numpy", "torch"))


def _jaxfit_text(e: dict[str, Any]) -> str:
    """JAXFit's tenth call (first call), or why there is none."""
    peer = e.get("jaxfit") or {"error": "not measured"}
    if "median" not in peer:
        return f"— ({peer['error']})"
    return f"{_ms(peer['median'])} (first call {_ms(peer['first_call'])})"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _target(n: int) -> float:
    return TARGETS.get(n, TARGET_LARGE)


def rows(results: dict[str, Any]) -> list[Row]:
    """Per case: each model's tenth call (second process) over SciPy's, default threads
    over one, and JAXFit's tenth call over SciPy's (no target)."""
    rows = []
    for e in results["cases"]:
        med, r = e["median"], e["ratios"]
        label = f"small fit {e['case']} N={e['n']:,}"
        load = f"load {e['load_before']:.1f} → {e['load_after']:.1f}"
        firsts = {p: _first_calls(e, p) for p in PROCESSES}
        for model, kind in (("NumPy", "numpy"), ("torch", "torch")):
            side = f"ours_{kind}_model"
            rows.append(
                row(
                    f"{label}: ours ({model} model, tenth call) / SciPy",
                    r[f"{kind}_model_vs_scipy"],
                    _target(e["n"]),
                    detail=f"ours {_ms(med[side])} (first call: second process "
                    f"{_ms(firsts['second_process'].get(side))}, first process "
                    f"{_ms(firsts['first_process'].get(side))}), SciPy {_ms(med['scipy'])}; "
                    f"{load}",
                )
            )
        second = firsts["second_process"]
        for model, kind in (("NumPy", "numpy"), ("torch", "torch")):
            side = f"ours_{kind}_model"
            if side in second and "scipy" in second:
                rows.append(
                    row(
                        f"{label}: ours ({model} model, first call of a second process) / "
                        "SciPy's first call",
                        second[side] / second["scipy"],
                        _target(e["n"]),
                        detail=f"ours {_ms(second[side])}, SciPy {_ms(second['scipy'])}",
                    )
                )
        rows.append(
            row(
                f"{label}: torch model, {e['threads_default']} threads / 1 thread",
                r["default_vs_one_thread"],
                THREADS_TARGET,
                detail=f"{_ms(med['ours_torch_model'])} against "
                f"{_ms(med['ours_torch_model_1_thread'])}",
            )
        )
        if "compiled_vs_scipy" in r:
            rows.append(
                row(
                    f"{label}: ours (torch model, compile=True, tenth call) / SciPy",
                    r["compiled_vs_scipy"],
                    None,
                    detail=f"ours {_ms(med['ours_torch_model_compiled'])} (first call: second "
                    f"process {_ms(firsts['second_process'].get('ours_torch_model_compiled'))}, "
                    f"first process, compiling "
                    f"{_ms(firsts['first_process'].get('ours_torch_model_compiled'))})",
                )
            )
        rows.append(
            row(
                f"{label}: JAXFit (tenth call) / SciPy",
                r.get("jaxfit_vs_scipy"),
                None,
                detail=f"JAXFit {_jaxfit_text(e)}, SciPy {_ms(med['scipy'])}",
            )
        )
    return rows


def section(results: dict[str, Any]) -> str:
    versions = next(
        (e["jaxfit"]["versions"] for e in results["cases"] if "versions" in e.get("jaxfit", {})),
        None,
    )
    jaxfit = (
        "JAXFit " + ", ".join(f"{k} {v}" for k, v in versions.items())
        if versions
        else "JAXFit not measured"
    )
    out = [
        f"{results['problem']}; device {results['device']}. SciPy: curve_fit(f, x, y, p0) "
        "defaults ('lm'); ours: marquardt.solver.curve_fit, default arguments, with the same f "
        "(NumPy model, finite differences) and with f in torch (autodiff), default threads and "
        f"one thread; JAXFit: CurveFit().curve_fit, f in jax.numpy, on the CPU ({jaxfit}). "
        "Each case ran twice, in two processes one after the other sharing the user's cache "
        "folder; figures from the second process: interleaved calls from each side's tenth "
        "on, medians; first calls (NumPy / torch model) of both processes beside them.",
        "",
        "| case | N | SciPy | ours, NumPy model | ours, torch model | torch, 1 thread "
        "| torch, compile=True | NumPy / SciPy | torch / SciPy | compile=True / SciPy | first call, second process | first call, first process "
        "| JAXFit | JAXFit / SciPy | max rel. popt diff | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in results["cases"]:
        med, r = e["median"], e["ratios"]
        diff = max(e["max_relative_popt_difference_to_scipy"].values())
        vs_jaxfit = r.get("jaxfit_vs_scipy")
        out.append(
            f"| {e['case']} | {e['n']:,} | {_ms(med['scipy'])} | "
            f"{_ms(med['ours_numpy_model'])} | {_ms(med['ours_torch_model'])} | "
            f"{_ms(med['ours_torch_model_1_thread'])} | "
            f"{_ms(med.get('ours_torch_model_compiled'))} | "
            f"{r['numpy_model_vs_scipy']:.2f}× | {r['torch_model_vs_scipy']:.2f}× | "
            f"{_ratio(r.get('compiled_vs_scipy'))} | "
            f"{_pair(_first_calls(e, 'second_process'))} | "
            f"{_pair(_first_calls(e, 'first_process'))} | {_jaxfit_text(e)} | "
            f"{_ratio(vs_jaxfit)} | {diff:.1e} | "
            f"{e['load_before']:.1f} → {e['load_after']:.1f} |"
        )
    return "\n".join(out)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick, device=o.device)
