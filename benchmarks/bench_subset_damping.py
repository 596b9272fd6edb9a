"""λ for block steps: one λ shared by all blocks, or one λ per block? Measured, not assumed.

Problem: the 1-64-64-1 tanh MLP (P = 4,353) on ``sinc(10 x)``, shuffled batches of
N = 2000, float32, 2 threads; ``LMA(params_per_step=512, param_selection="layer")``
(10 blocks: W1 and b1; W2 in 8 runs of 512; b2, W3, b3), ``STEPS`` steps from the same
start and batches, for seeds 0, 1, 2. "shared" is LMA as it is (the damping rule holds
one λ); "per block" keeps one damping state per block and loads it before the block's
step (``damping_rule.load_state_dict``), which is what a per-block λ would do.
Reported: full-data MSE at the end, rejected attempts and seconds, per variant and seed.
``python benchmarks/run_all.py subset_damping`` (``--quick``: 10 steps, seed 0).
"""

from __future__ import annotations

import time
from typing import Any

import _common as c
import _machine
import torch
from _registry import Options
from _rows import row

from marquardt.testing.problems import sinc, tanh_mlp

WIDTHS = (1, 64, 64, 1)
N = 2000
K = 512
STEPS = 60
SEEDS = (0, 1, 2)


def _fit(seed: int, per_block: bool, steps: int) -> dict[str, Any]:
    from marquardt.solver import LMA

    model = tanh_mlp(WIDTHS, seed)
    lma = LMA(model, ["cpu"], lambda a, b: a - b, params_per_step=K, param_selection="layer")
    x_all, y_all = sinc()
    batches = c.shuffled_batches(x_all, y_all, N, seed)
    states: dict[int, dict[str, float]] = {}
    rejected = 0
    start = time.perf_counter()
    for _ in range(steps):
        block = lma.state_dict()["param_selection"]["cursor"]
        if per_block and block in states:
            lma.damping_rule.load_state_dict(states[block])
        x, y = next(batches)
        lma.step(x, y)
        assert lma.report is not None
        rejected += lma.report.attempts - int(lma.report.accepted)
        if per_block:
            states[block] = dict(lma.damping_rule.state_dict())
    seconds = time.perf_counter() - start
    with torch.no_grad():
        mse = float(((model(x_all) - y_all) ** 2).mean())
    return {"mse": mse, "rejected": rejected, "seconds": seconds}


def main(quick: bool = False) -> dict[str, Any]:
    c.setup_threads()
    steps, seeds = (10, SEEDS[:1]) if quick else (STEPS, SEEDS)
    out: dict[str, Any] = {
        "machine": _machine.describe(),
        "load_before": _machine.load_average(),
        "runs": {},
    }
    out["steps"] = steps
    for seed in seeds:
        for per_block in (False, True):
            name = f"{'per-block' if per_block else 'shared'} seed {seed}"
            out["runs"][name] = _fit(seed, per_block, steps)
            print(name, out["runs"][name], flush=True)
    out["load_after"] = _machine.load_average()
    return out


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per seed, the per-block λ's final MSE over the shared λ's (information, no target)."""
    runs = results["runs"]
    rows = []
    for name, shared in runs.items():
        if not name.startswith("shared "):
            continue
        seed = name.removeprefix("shared ")
        block = runs.get(f"per-block {seed}")
        if block is None:
            continue
        rows.append(
            row(
                f"subset_damping: per-block λ / shared λ, final MSE ({seed})",
                block["mse"] / shared["mse"],
                None,
                detail=f"shared {shared['mse']:.2e} ({shared['rejected']} rejected), per-block "
                f"{block['mse']:.2e} ({block['rejected']} rejected)",
            )
        )
    return rows


def section(results: dict[str, Any]) -> str:
    lines = [
        f"1-64-64-1 (P = 4,353), layer rule with k = {K} (10 blocks), N = {N}, "
        f"{results.get('steps', STEPS)} steps from the same start and batches per seed; load "
        f"{results['load_before']:.1f} → {results['load_after']:.1f}.",
        "",
        "| variant, seed | final MSE | rejected attempts | seconds |",
        "|---|---|---|---|",
    ]
    for name, run in results["runs"].items():
        lines.append(f"| {name} | {run['mse']:.2e} | {run['rejected']} | {run['seconds']:.1f} |")
    return "\n".join(lines)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick)
