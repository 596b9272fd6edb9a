"""The Trainer on CPUs: threads of a 2-process spawn, and the Trainer's own overhead.

Problem: a 2-128-128-1 tanh MLP (P = 16,897) trained with Adam (lr 1e-3) on 100,000
points of ``y = sin(πx₀)·cos(πx₁)`` on ``[-1, 1]²``, float32, in shuffled batches of 256,
for 3 epochs (``--quick``: 20,000 points, 1 epoch); and the seed's small model (1-16-1,
ReLU; ``y = sin(2πx)`` on 100,000 points of ``[0, 1]``), the same way. Every run is a
fresh process, its data and model seeded alike; wall seconds of the whole call.

* Threads: ``Trainer.fit`` with ``TrainConfig(nprocs=2, backend="gloo",
  compute_setup="cpu")``, started with no thread setting (each rank's threads are the
  devices' rule: the cores over the 2 processes), against the same run started with
  ``OMP_NUM_THREADS=1``. Target ≤ 1.1×. The fastest of 3 runs each, alternated. For
  information, the same run with every rank on all the cores
  (``threads_per_process`` = the cores: what each rank ran before the rule), once.
* Overhead: ``Trainer.fit`` in one process (``TrainConfig(batch_size=256,
  max_iter=epochs - 1)``: perceptrain counts epochs from 0, tracking by ``metrics.csv``
  alone) against a plain PyTorch loop (``for x, y in loader: zero_grad, forward,
  mse_loss, backward, step``) on the same ``DataLoader``, model and optimizer. Target ≤
  1.15×. The fastest of 3 runs each, alternated (the machine is shared: the fastest run is
  the one least disturbed by other work).

``python benchmarks/run_all.py trainer [--quick]``.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from typing import Any

import _child
import _common as c
import _machine
import torch
from _registry import Options
from _rows import row
from torch import nn

TARGET_THREADS = 1.1
TARGET_OVERHEAD = 1.15
BATCH = 256
LR = 1e-3
REPEATS = 3
SPAWN_REPEATS = 3
TIMEOUT = 600.0
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: name -> (points, epochs) of a full and a quick run
SIZES = {False: (100_000, 3), True: (20_000, 1)}


def _data(name: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(c.SEED)
    if name == "mlp":
        x = torch.rand(n, 2, generator=generator) * 2 - 1
        return x, (torch.sin(math.pi * x[:, :1]) * torch.cos(math.pi * x[:, 1:]))
    x = torch.rand(n, 1, generator=generator)
    return x, torch.sin(2 * math.pi * x)


def _model(name: str) -> nn.Module:
    torch.manual_seed(c.SEED)
    if name == "mlp":
        return nn.Sequential(
            nn.Linear(2, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 1)
        )
    return nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1))


def fit(
    kind: str, name: str, n: int, epochs: int, nprocs: int, threads: int | None = None
) -> dict[str, Any]:
    """One run in this (fresh) process: ``kind`` "trainer" or "plain" (``threads``: the
    trainer's ``threads_per_process``); wall seconds of the training call, the full-data
    MSE after it, and the threads this process ran."""
    from torch.utils.data import DataLoader, TensorDataset

    from marquardt.trainer import TrainConfig, Trainer

    x, y = _data(name, n)
    torch.manual_seed(c.SEED)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    model = _model(name)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        if kind == "trainer":
            config = TrainConfig(
                nprocs=nprocs,
                backend="gloo",
                compute_setup="cpu",
                max_iter=epochs - 1,
                batch_size=BATCH,
                root_folder=folder,
                tracking_tool="csv",
                verbose=False,
                threads_per_process=threads,
            )
            Trainer(model, optimizer, config, loss_fn="mse").fit(loader)
        else:
            for _ in range(epochs):
                for xb, yb in loader:
                    optimizer.zero_grad()
                    loss = nn.functional.mse_loss(model(xb), yb)
                    loss.backward()
                    optimizer.step()
        seconds = time.perf_counter() - start
    with torch.no_grad():
        final = float(nn.functional.mse_loss(model(x), y))
    return {"seconds": seconds, "mse": final, "threads": torch.get_num_threads()}


def _child_run(args: list[Any], threads_one: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    if threads_one:
        env.update(dict.fromkeys(THREAD_VARIABLES, "1"))
    result, error = _child.finish(_child.start("bench_trainer", "fit", args, env=env), TIMEOUT)
    return result if result is not None else {"error": error}


def main(quick: bool = False) -> dict[str, Any]:
    n, epochs = SIZES[quick]
    results: dict[str, Any] = {
        "machine": _machine.describe(),
        "n": n,
        "epochs": epochs,
        "threads": {},
        "overhead": {},
    }
    load = [_machine.load_average()]
    spawns: dict[str, list[dict[str, Any]]] = {"default": [], "OMP_NUM_THREADS=1": []}
    for k in range(SPAWN_REPEATS):
        for label, one in (("default", False), ("OMP_NUM_THREADS=1", True)):
            print(f"mlp nprocs=2, {label}, run {k + 1}/{SPAWN_REPEATS}", flush=True)
            spawns[label].append(_child_run(["trainer", "mlp", n, epochs, 2], one))
    print("mlp nprocs=2, every rank on all the cores", flush=True)
    cores = os.cpu_count() or 1
    spawns["all cores per rank"] = [_child_run(["trainer", "mlp", n, epochs, 2, cores], False)]
    results["threads"] = spawns
    load.append(_machine.load_average())
    for name in ("mlp", "seed"):
        runs: dict[str, list[dict[str, Any]]] = {"trainer": [], "plain": []}
        for k in range(REPEATS):
            for kind in ("trainer", "plain"):
                print(f"{name} {kind} run {k + 1}/{REPEATS}", flush=True)
                runs[kind].append(_child_run([kind, name, n, epochs, 1], False))
        results["overhead"][name] = runs
    load.append(_machine.load_average())
    results["load"] = load
    return results


def _seconds(runs: list[dict[str, Any]]) -> float | None:
    """The fastest run's seconds (None when one failed)."""
    good = [r["seconds"] for r in runs if "seconds" in r]
    return min(good) if good and len(good) == len(runs) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def rows(results: dict[str, Any]) -> list[Any]:
    """The two targets: default threads against one thread, the Trainer against a loop."""
    n, epochs = results["n"], results["epochs"]
    load = results["load"]
    size = f"{n:,} points, batch {BATCH}, {epochs} epoch(s)"
    default = _seconds(results["threads"]["default"])
    one = _seconds(results["threads"]["OMP_NUM_THREADS=1"])
    out = [
        row(
            f"trainer 2-128-128-1 nprocs=2 ({size}): default threads / OMP_NUM_THREADS=1",
            _ratio(default, one),
            TARGET_THREADS,
            detail=f"{c.seconds_text(one)} → {c.seconds_text(default)}; fastest of "
            f"{SPAWN_REPEATS}; load {load[0]:.1f} → {load[1]:.1f}",
        )
    ]
    every = _seconds(results["threads"].get("all cores per rank", []))
    if every is not None:
        out.append(
            row(
                f"trainer 2-128-128-1 nprocs=2 ({size}): all cores per rank / OMP_NUM_THREADS=1",
                _ratio(every, one),
                None,
                detail=f"{c.seconds_text(one)} → {c.seconds_text(every)}; one run: each "
                "rank on torch's default count, as before the thread rule",
            )
        )
    names = {"mlp": "2-128-128-1", "seed": "seed 1-16-1"}
    for name, runs in results["overhead"].items():
        trainer, plain = _seconds(runs["trainer"]), _seconds(runs["plain"])
        out.append(
            row(
                f"trainer {names[name]} ({size}): Trainer.fit / plain PyTorch loop",
                _ratio(trainer, plain),
                TARGET_OVERHEAD,
                detail=f"{c.seconds_text(plain)} → {c.seconds_text(trainer)}; fastest of "
                f"{REPEATS}; load {load[1]:.1f} → {load[2]:.1f}",
            )
        )
    return out


def section(results: dict[str, Any]) -> str:
    """The RESULTS.md section: the rows and every run's time, MSE and threads."""
    m = results["machine"]
    lines = [
        f"{m['cpu']}, {m['cores']} cores; Adam (lr {LR:g}) on float32 data, batch {BATCH}, "
        f"{results['n']:,} points, {results['epochs']} epoch(s); each run a fresh process, "
        "wall seconds of the whole call (a spawn's start included). Load: the 1-minute "
        "load average before → after each part is in the rows.",
        "",
        "| what | value | target | verdict | detail |",
        "|---|---|---|---|---|",
    ]
    for r in rows(results):
        lines.append(f"| {r.what} | {r.shown} | {r.target} | {r.verdict} | {r.detail} |")
    lines += ["", "| run | seconds | full-data MSE | torch threads |", "|---|---|---|---|"]
    for label, each in results["threads"].items():
        for k, r in enumerate(each):
            lines.append(_run_line(f"2-128-128-1 nprocs=2, {label}, run {k + 1}", r))
    for name, runs in results["overhead"].items():
        for kind, each in runs.items():
            for k, r in enumerate(each):
                lines.append(_run_line(f"{name} {kind} run {k + 1}", r))
    lines += [
        "",
        "The threads of the spawned ranks are not visible from the parent (its own count "
        "is shown for the spawns); the trainer's tests check them in each rank.",
    ]
    return "\n".join(lines)


def _run_line(label: str, r: dict[str, Any]) -> str:
    if "seconds" not in r:
        return f"| {label} | failed: {r.get('error', '')[:80]} | | |"
    return f"| {label} | {r['seconds']:.2f} | {r['mse']:.3g} | {r['threads']} |"


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick)
