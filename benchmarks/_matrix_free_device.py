"""``bench_matrix_free.py`` on a GPU (``--device cuda``): its large network against Adam.

The 1-512-512-512-1 tanh MLP (P = 526,849; ``quick``: 1-32-32-1) on the seed's sinc data,
float32, everything on ``device``: ``LMA(strategy="matrix_free")`` on shuffled batches of
N = 10,000 against Adam (learning rate 1e-3, batches of 1,000), each for ``budget``
seconds of training from the same start; the full-data MSE at the end, the LM step's
median time, its CG iterations and the peak device memory of its steps (CUDA only).

Targets (issue "LM where JᵀJ does not fit"): the MSE ≤ Adam's at the same budget; the
peak memory of a step ≤ 1 GiB.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import _common as c
import _machine
import torch
from _rows import Row, row

from marquardt.testing.problems import sinc, tanh_mlp

QUICK = (1, 32, 32, 1)
QUICK_N = 1_000
ADAM_LR = 1e-3
TARGET_MSE = 1.0
TARGET_MEMORY_MIB = 1024.0


def _batches(x: torch.Tensor, y: torch.Tensor, size: int) -> Any:
    for xb, yb in c.shuffled_batches(x, y, size, c.SEED):
        yield xb.to(x.device), yb.to(x.device)


def _lm(widths: tuple[int, ...], n: int, device: torch.device, budget: float) -> dict[str, Any]:
    from marquardt.solver import LMA

    x, y = (t.to(device) for t in sinc())
    model = tanh_mlp(widths, c.SEED).to(device)
    lma = LMA(model, [device], lambda a, b: a - b, strategy="matrix_free")
    batches = _batches(x, y, n)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    seconds: list[float] = []
    cg: list[int] = []
    while sum(seconds) < budget:
        xb, yb = next(batches)
        c.synchronize(device)
        start = time.perf_counter()
        lma.step(xb, yb)
        c.synchronize(device)
        seconds.append(time.perf_counter() - start)
        cg.extend(lma.report.cg_iterations)
    peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
    return {
        "strategy": lma.report.strategy,
        "steps": len(seconds),
        "median_step_seconds": statistics.median(seconds),
        "cg_iterations": cg,
        "peak_memory_bytes": peak,
        "mse": c.full_mse(model, x, y),
    }


def _adam(widths: tuple[int, ...], device: torch.device, budget: float) -> dict[str, Any]:
    x, y = (t.to(device) for t in sinc())
    model = tanh_mlp(widths, c.SEED).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=ADAM_LR)
    batches = _batches(x, y, c.ADAM_BATCH)
    steps = 0
    c.synchronize(device)
    start = time.perf_counter()
    while time.perf_counter() - start < budget:
        xb, yb = next(batches)
        opt.zero_grad()
        ((model(xb) - yb) ** 2).mean().backward()
        opt.step()
        steps += 1
        if steps % 50 == 0:
            c.synchronize(device)
    return {"steps": steps, "mse": c.full_mse(model, x, y)}


def main(quick: bool = False, device: str = "cpu", budget: float = 10.0) -> dict[str, Any]:
    """LM (matrix-free) and Adam, ``budget`` seconds each, on ``device``."""
    where = torch.device(device)
    widths = QUICK if quick else c.LARGE_WIDTHS
    n = QUICK_N if quick else c.LARGE_N
    out: dict[str, Any] = {
        "device": str(where),
        "widths": list(widths),
        "params": c.mlp_params(widths),
        "n": n,
        "budget_seconds": budget,
        "load_before": _machine.load_average(),
    }
    out["lm"] = _lm(widths, n, where, budget)
    out["adam"] = _adam(widths, where, budget)
    out["load_after"] = _machine.load_average()
    return out


def rows(results: dict[str, Any]) -> list[Row]:
    """LM's MSE over Adam's at the same budget, and the peak device memory of its steps."""
    lm, adam = results["lm"], results["adam"]
    label = f"matrix-free {'-'.join(map(str, results['widths']))} (P={results['params']:,})"
    rows = [
        row(
            f"{label}: MSE ours / Adam at {results['budget_seconds']:g} s",
            lm["mse"] / adam["mse"],
            TARGET_MSE,
            detail=f"ours {lm['mse']:.3g} ({lm['steps']} steps), Adam {adam['mse']:.3g} "
            f"({adam['steps']} steps)",
        )
    ]
    if lm["peak_memory_bytes"] is not None:
        rows.append(
            row(
                f"{label}: peak device memory of the steps",
                lm["peak_memory_bytes"] / 2**20,
                TARGET_MEMORY_MIB,
                unit=" MiB",
            )
        )
    return rows


def section(results: dict[str, Any]) -> str:
    """Both sides' steps, MSE and memory."""
    lm, adam = results["lm"], results["adam"]
    cg = lm["cg_iterations"]
    peak = lm["peak_memory_bytes"]
    return "\n".join(
        [
            f"{'-'.join(map(str, results['widths']))} tanh MLP (P = {results['params']:,}) on "
            f"the sinc data, float32, on {results['device']}; {results['budget_seconds']:g} s "
            f"of training each; LM matrix-free on batches of {results['n']:,}, Adam "
            f"(lr {ADAM_LR:g}) on batches of {c.ADAM_BATCH:,}.",
            "",
            "| side | steps | full-data MSE | median step | CG iterations per attempt | "
            "peak memory |",
            "|---|---|---|---|---|---|",
            f"| LM ({lm['strategy']}) | {lm['steps']} | {lm['mse']:.3g} | "
            f"{lm['median_step_seconds'] * 1e3:.0f} ms | "
            f"{statistics.median(cg) if cg else '—'} | "
            f"{'—' if peak is None else f'{peak / 2**20:,.0f} MiB'} |",
            f"| Adam | {adam['steps']} | {adam['mse']:.3g} | — | — | — |",
        ]
    )
