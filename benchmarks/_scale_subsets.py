"""Parameter subsets at P = 526,849: ours (layer, random) against the peer's selection.

Problem: the 1-512-512-512-1 tanh MLP (P = 526,849; its P × P system would be 2 TiB in
float64, J of one batch 20 GiB in float32) on ``sinc(10 x)``, shuffled batches of
N = 10000, float32, 2 threads. Every LM side updates k = 4096 parameters per step:

* ours, ``LMA(params_per_step=4096, param_selection="layer")`` and ``"random"`` (seed 0),
  ``step(x, y)`` without a slice size;
* the peer, ``LevenbergMarquardtModule(solve_method="cholesky",
  param_selection_strategy=RandomSelectionStrategy(params, 4096), max_batch_size=500)``
  (without ``max_batch_size`` its per-sample gradients of one batch are 10000 × P × 4 B =
  21 GB). The peer's ``LayerSelectionStrategy`` selects one whole parameter tensor per
  step and takes no k: the 512 × 512 weights give a 262,144² system (256 GiB in float32),
  so it cannot run here; it is recorded as such, not run.
* Adam (``torch.optim.Adam``) on minibatches of 1000, at each of ``ADAM_LRS``; the best
  final MSE is Adam's figure.

Each side trains from the same initial parameters for ``BUDGET_SECONDS`` of wall time (the
clock checked after each step; one step in flight may overrun it) and is then scored by
its MSE on the full 100,000 points. Time per step is the median over its steps after the
first. Peak RSS: one step of each LM side in a fresh process (``bench_scale.rss_child``'s
method: the peak mark reset after set-up, the growth of the peak during the step).

Targets: ours ≤ 0.67 × the peer's median step; our peak RSS growth ≤ the peer's; our full
MSE after the budget below both the peer's and Adam's best.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import _child
import _common as c
import _machine
import torch
from _rows import Row, row

from marquardt.testing.problems import sinc, tanh_mlp

WIDTHS = c.LARGE_WIDTHS
N = c.LARGE_N
K = 4096
SEED = 0
BUDGET_SECONDS = 45.0
PEER_SLICE = 500
RSS_TIMEOUT = 300.0
TARGET_PEER = 0.67
TARGET_RSS = 1.0
SIDES = ("ours_layer", "ours_random", "peer_random")


def _residual(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a - b


def make_side(kind: str) -> tuple[Callable[[torch.Tensor, torch.Tensor], None], torch.nn.Module]:
    """One LM step of ``kind`` on a fresh ``tanh_mlp(WIDTHS)``, and the model."""
    model = tanh_mlp(WIDTHS, SEED)
    if kind.startswith("ours"):
        from marquardt.solver import LMA

        rule = kind.removeprefix("ours_")
        lma = LMA(model, ["cpu"], _residual, params_per_step=K, param_selection=rule, seed=SEED)

        def ours(x: torch.Tensor, y: torch.Tensor) -> None:
            lma.step(x, y)

        return ours, model
    tlm = c.import_peer()
    strategy = tlm.selection.RandomSelectionStrategy(model.parameters(), K)
    module = tlm.training.LevenbergMarquardtModule(
        model,
        solve_method="cholesky",
        param_selection_strategy=strategy,
        max_batch_size=PEER_SLICE,
    )

    def peer(x: torch.Tensor, y: torch.Tensor) -> None:
        module.training_step(x, y)

    return peer, model


def train_lm(kind: str) -> dict[str, Any]:
    """``kind`` trained for the budget: step seconds, steps, full MSE."""
    step, model = make_side(kind)
    x_all, y_all = sinc()
    batches = c.shuffled_batches(x_all, y_all, N, SEED)
    seconds: list[float] = []
    error = ""
    start = time.perf_counter()
    while time.perf_counter() - start < BUDGET_SECONDS:
        x, y = next(batches)
        t = time.perf_counter()
        try:
            step(x, y)
        except Exception as exc:  # out of memory, say: a result
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            break
        seconds.append(time.perf_counter() - t)
    return {
        "steps": len(seconds),
        "step_seconds": seconds,
        "median_step": c.median(seconds[1:] if len(seconds) > 1 else seconds),
        "wall": time.perf_counter() - start,
        "mse": c.full_mse(model),
        "error": error,
    }


def train_adam(lr: float) -> dict[str, Any]:
    """Adam at ``lr`` on minibatches for the budget; its full MSE."""
    model = tanh_mlp(WIDTHS, SEED)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x_all, y_all = sinc()
    batches = c.shuffled_batches(x_all, y_all, c.ADAM_BATCH, SEED)
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < BUDGET_SECONDS:
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        steps += 1
    return {"lr": lr, "steps": steps, "wall": time.perf_counter() - start, "mse": c.full_mse(model)}


def rss_child(kind: str) -> dict[str, Any]:
    """One step of ``kind`` in this fresh process; its peak RSS growth."""
    c.setup_threads()
    x_all, y_all = sinc()
    x, y = next(c.shuffled_batches(x_all, y_all, N, SEED))
    step, _ = make_side(kind)
    return _machine.step_rss(lambda: step(x, y))


def measure() -> dict[str, Any]:
    """Everything above, each side's peak RSS in a process of its own (``rss_child``)."""
    c.setup_threads()
    out: dict[str, Any] = {
        "widths": list(WIDTHS),
        "params": c.mlp_params(WIDTHS),
        "n": N,
        "k": K,
        "budget_seconds": BUDGET_SECONDS,
        "load_before": _machine.load_average(),
        "peer_layer": "not run: LayerSelectionStrategy selects one whole tensor per step; "
        "the 512 × 512 weights give a 262,144² system (256 GiB in float32)",
    }
    out["initial_mse"] = c.full_mse(tanh_mlp(WIDTHS, SEED))
    for kind in SIDES:
        out[kind] = train_lm(kind)
        gc.collect()
    out["adam"] = [train_adam(lr) for lr in c.ADAM_LRS]
    out["rss"] = {}
    for kind in SIDES:
        result, error = _child.call("_scale_subsets", "rss_child", [kind], timeout=RSS_TIMEOUT)
        out["rss"][kind] = result if result is not None else {"error": error}
    out["load_after"] = _machine.load_average()
    return out


def _fmt_s(value: float | None) -> str:
    return "—" if value is None or value != value else f"{value:.2f} s"


def summary(e: dict[str, Any]) -> list[Row]:
    """Rows with verdicts for the aggregate table."""
    label = f"subsets k={e['k']} {c.mlp_name(e['widths'])} (P={e['params']:,}) N={e['n']:,}"
    peer = e["peer_random"]
    adam = min(e["adam"], key=lambda a: a["mse"])
    rows = []
    peer_rss = e["rss"].get("peer_random", {}).get("growth_mib")
    for kind in ("ours_layer", "ours_random"):
        ours = e[kind]
        rule = kind.removeprefix("ours_")
        ratio = ours["median_step"] / peer["median_step"] if peer["steps"] else None
        rows.append(
            row(
                f"{label}: {rule} step / peer random",
                ratio,
                TARGET_PEER,
                detail=f"ours {_fmt_s(ours['median_step'])} ({ours['steps']} steps), peer "
                f"{_fmt_s(peer['median_step'])} ({peer['steps']} steps) in "
                f"{e['budget_seconds']:.0f} s"
                + (f"; peer: {peer['error']}" if peer["error"] else ""),
            )
        )
        growth = e["rss"].get(kind, {}).get("growth_mib")
        rows.append(
            row(
                f"{label}: {rule} peak RSS / peer",
                None if growth is None or peer_rss is None else growth / max(peer_rss, 1.0),
                TARGET_RSS,
                detail=f"ours {growth if growth is None else round(growth)} MiB, peer "
                f"{peer_rss if peer_rss is None else round(peer_rss)} MiB (growth of one step)",
            )
        )
        best_other = min(peer["mse"], adam["mse"])
        rows.append(
            row(
                f"{label}: {rule} MSE / best of peer, Adam",
                ours["mse"] / best_other,
                1.0,
                detail=f"full-data MSE after {e['budget_seconds']:.0f} s: ours {ours['mse']:.3g}, "
                f"peer {peer['mse']:.3g}, Adam {adam['mse']:.3g} (lr {adam['lr']:g}, best of "
                f"{', '.join(format(a['lr'], 'g') for a in e['adam'])}); start {e['initial_mse']:.3g}",
            )
        )
    return rows


def main() -> str:
    """This part alone: ``results/scale-subsets.json`` (``python benchmarks/_child.py
    _scale_subsets main``); its path."""
    part = {"machine": _machine.describe(), "subsets": measure()}
    return str(c.write_json("scale-subsets", part))
