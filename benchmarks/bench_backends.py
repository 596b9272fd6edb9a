"""LM step time on the sinc problem by array backend: NumPy, torch, cuPyNumeric on Legate CPUs.

Problem: ``y = sinc(10 x)`` on ``x ∈ [-1, 1]``, a 1-256-1 tanh MLP (``P = 769``), one
batch of ``N = 10000`` samples, float32, one model device (the CPU). One LM step
(``LMA.step``: Jacobian, assembly of (JᵀJ/N + λD)δ = Jᵀr/N, float64 Cholesky solves, trial
forwards) is timed for each backend and strategy from the same start:

* ``numpy`` and ``torch`` in this process, with 1 and 2 torch threads;
* ``cupynumeric`` in child processes (Legate starts once per process and changes process
  state): ``python`` with ``LEGATE_CONFIG="--cpus 1 --gpus 0"`` and 1 torch thread, and
  ``legate --cpus 2 --gpus 0`` with 1 torch thread. On a machine without an NVIDIA driver
  the children get the driver stub of ``packages/core-solver/tests/legate_support``.

The point is to state honestly what Legate costs on one CPU node, where it has nothing to
distribute: every cuPyNumeric operation is a Legate task (about a millisecond of runtime
overhead each on this machine) and J is copied into a Legate array before JᵀJ is formed.
Legate pays off when J no longer fits one device; see the design notes.

Figures are medians over the timed steps (``min_step_s`` is kept too: on shared cores
the minimum is the better estimate); the 1-minute load average before and after is
recorded beside them. Run ``python benchmarks/run_all.py backends``; ``main()`` returns the results. Timings use ``marquardt.solver.time`` (Legate's
``time`` under Legate, which waits for queued Legate work) after ``backend.synchronize()``.
"""

from __future__ import annotations

import importlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _child
import _common as c
import torch
from _registry import Options
from _rows import row

from marquardt.testing.problems import sinc, tanh_mlp

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "backends.json"
SUPPORT = ROOT / "packages" / "core-solver" / "tests"
N = 10_000
STEPS = 5
WARMUP = 1
STRATEGIES = ("explicit", "accumulate")
CHILD_TIMEOUT = 1800.0


def time_steps(backend: str, strategy: str, threads: int) -> dict[str, Any]:
    """Median seconds of one LM step (after ``WARMUP`` steps), with the report's breakdown."""
    from marquardt.solver import LMA
    from marquardt.solver import time as clock

    torch.set_num_threads(threads)
    x, y = sinc(N)
    model = tanh_mlp((1, 256, 1))
    lma = LMA(model, [torch.device("cpu")], lambda a, b: a - b, backend=backend, strategy=strategy)
    for _ in range(WARMUP):
        lma.step(x, y)
    totals: list[float] = []
    cpu: list[float] = []
    parts: dict[str, list[float]] = {
        k: [] for k in ("jacobian", "transfer", "assembly", "solve", "trial")
    }
    attempts: list[int] = []
    losses: list[float] = []
    for _ in range(STEPS):
        start, start_cpu = clock(), time.process_time()
        loss, _ = lma.step(x, y)
        lma.backend.synchronize()
        totals.append((clock() - start) / 1e6)
        cpu.append(time.process_time() - start_cpu)
        report = lma.report
        for key in parts:
            parts[key].append(float(getattr(report, f"seconds_{key}")))
        attempts.append(int(report.attempts))
        losses.append(float(loss))
    return {
        "backend": lma.backend.name,
        "strategy": report.strategy,
        "torch_threads": threads,
        "median_step_s": statistics.median(totals),
        "min_step_s": min(totals),
        # CPU seconds of every thread of the process (Legate's included): less sensitive to
        # other work on shared cores than wall time, and an honest cost of its own.
        "median_step_cpu_s": statistics.median(cpu),
        "median_parts_s": {k: statistics.median(v) for k, v in parts.items()},
        "attempts": attempts,
        "losses": losses,
    }


def legate_child(threads: int) -> list[dict[str, Any]]:
    """Inside a Legate process (``_child.py``): the cuPyNumeric runs."""
    from legate.core import TaskTarget, get_legate_runtime

    runs = [time_steps("cupynumeric", s, threads) for s in STRATEGIES]
    cpus = int(get_legate_runtime().machine.count(TaskTarget.CPU))
    for run in runs:
        run["legate_cpus"] = cpus
    return runs


def _legate_support() -> Any:
    """``legate_support`` of the core-solver tests: the driver stub, the children's
    environment and the launcher."""
    if str(SUPPORT) not in sys.path:
        sys.path.insert(0, str(SUPPORT))
    return importlib.import_module("legate_support")


def _legate_env(stub_dir: Path | None) -> dict[str, str]:
    """The children's environment: Legate on one CPU with the driver stub, else (a machine
    with a driver) as the caller's, 1 CPU processor unless ``LEGATE_CONFIG`` says more."""
    support = _legate_support()
    if stub_dir is not None:
        return dict(support.env_for_legate_cpu(stub_dir, cpus=1))
    env = dict(support.env_for_legate())
    env.setdefault("LEGATE_CONFIG", "--cpus 1 --gpus 0 --sysmem 4000")
    return env


def _driver_present() -> bool:
    return any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/nvidiactl"))


def _legate_child(env: dict[str, str], launcher: list[str] | None) -> list[dict[str, Any]]:
    runs, error = _child.call(
        "bench_backends", "legate_child", [1], timeout=CHILD_TIMEOUT, env=env, launcher=launcher
    )
    if runs is None:
        under = f" under {' '.join(launcher)}" if launcher else ""
        raise RuntimeError(f"the cuPyNumeric runs failed{under}: {error}")
    return list(runs)


def legate_runs() -> list[dict[str, Any]]:
    """cuPyNumeric runs in child processes: python with 1 Legate CPU; legate with 2."""
    support = _legate_support()
    with tempfile.TemporaryDirectory() as scratch:
        stub_dir = None if _driver_present() else support.build_stub(scratch).parent
        env = _legate_env(stub_dir)
        runs = _legate_child(env, None)
        flags = ["--cpus", "2", "--gpus", "0", "--sysmem", "4000"]
        runs += _legate_child(env, [*support.legate_launcher(), *flags])
    return runs


def main() -> dict[str, Any]:
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    for threads in (1, 2):
        for backend in ("numpy", "torch"):
            for strategy in STRATEGIES:
                run = time_steps(backend, strategy, threads)
                run["legate_cpus"] = 0
                runs.append(run)
    runs += legate_runs()
    best_cpu = {
        s: min(r["median_step_s"] for r in runs if r["strategy"] == s and r["legate_cpus"] == 0)
        for s in STRATEGIES
    }
    for run in runs:
        run["ratio_to_best_non_legate"] = run["median_step_s"] / best_cpu[run["strategy"]]
    import numpy

    try:
        from importlib.metadata import version

        legate_version = version("legate")
    except Exception:  # not installed: the Legate rows failed above already
        legate_version = "absent"
    result = {
        "problem": {"name": "sinc(10x), 1-256-1 tanh MLP", "rows": N, "params": 769},
        "dtype": "float32",
        "steps_timed": STEPS,
        "warmup_steps": WARMUP,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "legate": legate_version,
            "nvidia_driver": _driver_present(),
            # The cores may be shared: a load above their count inflates every figure.
            "load_average_1min": [load_before[0], os.getloadavg()[0]],
        },
        "runs": runs,
    }
    return result


def echo(result: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    print(f"{'backend':12s} {'strategy':10s} {'legate cpus':>11s} {'threads':>7s} "
          f"{'step s':>8s} {'cpu s':>6s} {'jac':>6s} {'asm':>6s} {'solve':>6s} {'ratio':>6s}")  # fmt: skip
    for r in result["runs"]:
        p = r["median_parts_s"]
        print(
            f"{r['backend']:12s} {r['strategy']:10s} {r['legate_cpus']:11d} "
            f"{r['torch_threads']:7d} {r['median_step_s']:8.3f} {r['median_step_cpu_s']:6.2f} "
            f"{p['jacobian']:6.3f} "
            f"{p['assembly']:6.3f} {p['solve']:6.3f} {r['ratio_to_best_non_legate']:6.2f}"
        )


def rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for run in r.get("runs", []):
        if run.get("legate_cpus", 0) == 0 and run.get("torch_threads") != c.THREADS:
            continue
        where = (
            f"Legate {run['legate_cpus']} CPU"
            if run.get("legate_cpus")
            else f"{run['torch_threads']} threads"
        )
        rows.append(
            row(
                f"backends: {run['backend']} {run['strategy']} ({where}) / best",
                run.get("ratio_to_best_non_legate"),
                None,
                detail=f"step {run['median_step_s'] * 1e3:.0f} ms (min {run['min_step_s'] * 1e3:.0f})",
            )
        )
    return rows


def section(b: dict[str, Any]) -> str:
    out = [
        "| backend | strategy | Legate CPUs | torch threads | step (median) | min | "
        "jacobian | assembly | solve |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in b.get("runs", []):
        p = r["median_parts_s"]
        out.append(
            f"| {r['backend']} | {r['strategy']} | {r['legate_cpus']} | "
            f"{r['torch_threads']} | {r['median_step_s'] * 1e3:.0f} ms | "
            f"{r['min_step_s'] * 1e3:.0f} ms | {p['jacobian'] * 1e3:.0f} ms | "
            f"{p['assembly'] * 1e3:.0f} ms | {p['solve'] * 1e3:.0f} ms |"
        )
    return "\n".join(out)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main()
