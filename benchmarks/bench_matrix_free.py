"""Matrix-free LM where JᵀJ does not fit: against Adam, the dense step and the sinc goal.

Four problems, float32, 2 threads, every side from the same initial parameters:

* large: the 1-512-512-512-1 tanh MLP (P = 526,849; JᵀJ would be 2 TiB in float64) on
  ``sinc(10 x)``, shuffled batches of N = 10,000 (the subsets benchmark's data,
  ``_scale_subsets.py``). ``LMA(strategy="matrix_free", cg=TruncatedCG(iterations=10))``
  against Adam on minibatches of
  1000 at each of ``ADAM_LRS``, each for ``budget_seconds`` of wall time, scored by the MSE
  on the full 100,000 points; targets: our MSE ≤ Adam's best, and the peak RSS growth of
  one matrix-free step (a fresh process, ``_common.step_rss``) ≤ 1 GiB.
* regression: a 2-256-256-256-1 tanh MLP (P = 132,609) on 20,000 points of a smooth
  2-D function (``regression``), ``LMA`` with its defaults (the planner's strategy) on
  every point each step, against Adam on minibatches of 1000 at each of
  ``REGRESSION_LRS``, ``budget_seconds`` each; target: our full-data MSE ≤ Adam's best.
* medium (``medium=True``): 1-128-128-128-128-1 (P = 49,921), where the dense step fits.
  The dense LM (``strategy="explicit"``, forced: the planner now picks matrix-free
  here) runs ``dense_seconds``; its final
  full-data MSE is the goal, and the matrix-free LM runs until it reaches that goal or
  the same time; target: its time to the goal ≤ 1 × the dense LM's.
* sinc: the seed's tutorial network 1-256-1 (P = 769) on 2,000 points, matrix-free until
  the MSE reaches 1e-5 or ``sinc_seconds``: the target is reaching it.

``python benchmarks/run_all.py matrix_free [--quick]``; ``--device cuda`` runs its device path
(``_matrix_free_device.py``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import _child
import _common as c
import _machine
import _matrix_free_device as device_path
import torch
from _registry import Options
from _rows import Row, row

from marquardt.testing.problems import sinc, tanh_mlp

LARGE = c.LARGE_WIDTHS
MEDIUM = (1, 128, 128, 128, 128, 1)
N = c.LARGE_N
SEED = 0
SINC_HIDDEN = 256
SINC_N = 2000
SINC_GOAL = 1e-5
RSS_TIMEOUT = 300.0
TARGET_RSS_MIB = 1024.0
#: The CG budget per attempt at P = 526,849: one product there costs about a second on two
#: cores, so the default 50 would leave a 45 s budget one step.
LARGE_CG_ITERATIONS = 10
#: The regression network past 10⁵ parameters (P = 132,609): ``LMA``'s defaults (the
#: planner's choice) on every point each step, against Adam at ``REGRESSION_LRS``.
REGRESSION = (2, 256, 256, 256, 1)
REGRESSION_N = 20_000
REGRESSION_LRS = (1e-2, 3e-3, 1e-3)


def _residual(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a - b


def _lma(model: torch.nn.Module, strategy: str, iterations: int | None = None) -> Any:
    from marquardt.solver import LMA, TruncatedCG

    cg = None if iterations is None else TruncatedCG(iterations=iterations)
    return LMA(model, ["cpu"], _residual, strategy=strategy, cg=cg)


def regression() -> tuple[torch.Tensor, torch.Tensor]:
    """The regression problem's data: ``REGRESSION_N`` points uniform on [−1, 1]², y =
    sin(3x₁)·cos(2x₂) + ½x₁x₂, float32 (seeded)."""
    gen = torch.Generator().manual_seed(SEED)
    x = 2.0 * torch.rand(REGRESSION_N, 2, generator=gen) - 1.0
    y = torch.sin(3 * x[:, :1]) * torch.cos(2 * x[:, 1:]) + 0.5 * x[:, :1] * x[:, 1:]
    return x, y


def _data(problem: str) -> tuple[torch.Tensor, torch.Tensor]:
    return regression() if problem == "regression" else sinc()


def train_lm(
    widths: tuple[int, ...],
    strategy: str,
    seconds: float,
    goal: float | None = None,
    iterations: int | None = None,
    problem: str = "sinc",
) -> dict[str, Any]:
    """LM (``strategy``; ``iterations``: the CG budget, None: the default) on shuffled
    batches of N of ``problem``'s data (``regression``: the whole set each step) for
    ``seconds`` (or until the full MSE reaches ``goal``, checked after every step); the
    MSE curve over time."""
    model = tanh_mlp(widths, SEED)
    lma = _lma(model, strategy, iterations)
    x, y = _data(problem)
    batches = c.shuffled_batches(x, y, N if problem == "sinc" else x.shape[0], SEED)
    curve: list[tuple[float, float]] = [(0.0, c.full_mse(model, x, y))]
    cg: list[int] = []
    attempts = 0
    reached: float | None = None
    scoring = 0.0  # seconds spent on the full-data MSE, not counted as training
    start = time.perf_counter()
    while time.perf_counter() - start - scoring < seconds:
        lma.step(*next(batches))
        report = lma.report
        cg.extend(report.cg_iterations)
        attempts += report.attempts
        t = time.perf_counter()
        elapsed = t - start - scoring
        mse = c.full_mse(model, x, y)
        scoring += time.perf_counter() - t
        curve.append((elapsed, mse))
        if goal is not None and mse <= goal:
            reached = curve[-1][0]
            break
    return {
        "strategy": lma.report.strategy,
        "steps": len(curve) - 1,
        "attempts": attempts,
        "cg_iterations": cg,
        "curve": curve,
        "mse": curve[-1][1],
        "seconds_to_goal": reached,
    }


def train_adam(
    widths: tuple[int, ...], lr: float, seconds: float, problem: str = "sinc"
) -> dict[str, Any]:
    """Adam at ``lr`` on minibatches of ``c.ADAM_BATCH`` of ``problem``'s data for
    ``seconds``; its full MSE."""
    model = tanh_mlp(widths, SEED)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = _data(problem)
    batches = c.shuffled_batches(x, y, c.ADAM_BATCH, SEED)
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps += 1
    return {"lr": lr, "steps": steps, "mse": c.full_mse(model, x, y)}


def train_sinc(seconds: float) -> dict[str, Any]:
    """The tutorial's 1-256-1 network on 2,000 points, matrix-free, to MSE ``SINC_GOAL``."""
    torch.manual_seed(SEED)
    x = torch.linspace(-1, 1, SINC_N).unsqueeze(1)
    y = torch.sinc(10 * x)
    model = c.sinc_model(SINC_HIDDEN, SEED)
    lma = _lma(model, "matrix_free")
    start = time.perf_counter()
    loss, steps, reached = float("inf"), 0, None
    while time.perf_counter() - start < seconds:
        loss, terminated = lma.step(x, y)
        steps += 1
        if loss <= SINC_GOAL:
            reached = time.perf_counter() - start
            break
        if terminated:
            break
    return {"steps": steps, "mse": loss, "seconds_to_goal": reached, "params": 3 * SINC_HIDDEN + 1}


def rss_child() -> dict[str, Any]:
    """One matrix-free step of the large network in this fresh process: peak RSS growth."""
    c.setup_threads()
    x, y = next(c.shuffled_batches(*sinc(), N, SEED))
    lma = _lma(tanh_mlp(LARGE, SEED), "matrix_free", LARGE_CG_ITERATIONS)
    measured = _machine.step_rss(lambda: lma.step(x, y))
    measured["cg_iterations"] = list(lma.report.cg_iterations)
    return measured


def main(
    budget_seconds: float = 60.0,
    dense_seconds: float = 60.0,
    sinc_seconds: float = 60.0,
    medium: bool = True,
    quick: bool = False,
) -> dict[str, Any]:
    c.setup_threads()
    out: dict[str, Any] = {
        "machine": _machine.describe(),
        "load_before": _machine.load_average(),
        "n": N,
        "budget_seconds": budget_seconds,
        "large": {"widths": list(LARGE), "params": c.mlp_params(LARGE)},
    }
    large = out["large"]
    large["initial_mse"] = c.full_mse(tanh_mlp(LARGE, SEED))
    large["cg_iterations_budget"] = LARGE_CG_ITERATIONS
    large["matrix_free"] = train_lm(
        LARGE, "matrix_free", budget_seconds, iterations=LARGE_CG_ITERATIONS
    )
    print("large matrix_free", json.dumps(large["matrix_free"]["mse"]), flush=True)
    large["adam"] = [train_adam(LARGE, lr, budget_seconds) for lr in c.ADAM_LRS]
    print("large adam", [a["mse"] for a in large["adam"]], flush=True)
    reg = {"widths": list(REGRESSION), "params": c.mlp_params(REGRESSION), "n": REGRESSION_N}
    reg["lm"] = train_lm(REGRESSION, "auto", budget_seconds, problem="regression")
    reg["adam"] = [
        train_adam(REGRESSION, lr, budget_seconds, problem="regression")
        for lr in (REGRESSION_LRS[:1] if quick else REGRESSION_LRS)
    ]
    out["regression"] = reg
    print("regression", reg["lm"]["mse"], [a["mse"] for a in reg["adam"]], flush=True)
    result, error = _child.call("bench_matrix_free", "rss_child", timeout=RSS_TIMEOUT)
    large["rss"] = result if result is not None else {"error": error}
    if medium:
        dense = train_lm(MEDIUM, "explicit", dense_seconds)
        free = train_lm(MEDIUM, "matrix_free", dense_seconds, goal=dense["mse"])
        out["medium"] = {
            "widths": list(MEDIUM),
            "params": c.mlp_params(MEDIUM),
            "dense": dense,
            "matrix_free": free,
        }
        print("medium", dense["mse"], free["mse"], free["seconds_to_goal"], flush=True)
    out["sinc"] = train_sinc(sinc_seconds)
    print("sinc", out["sinc"], flush=True)
    out["load_after"] = _machine.load_average()
    return out


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def rows(e: dict[str, Any]) -> list[Row]:
    if "lm" in e:  # a run on a GPU
        return device_path.rows(e)
    """Rows with verdicts for the aggregate table."""
    large = e["large"]
    label = f"matrix-free {c.mlp_name(large['widths'])} (P={large['params']:,}) N={e['n']:,}"
    ours = large["matrix_free"]
    adam = min(large["adam"], key=lambda a: a["mse"])
    cg = ours["cg_iterations"]
    rows = [
        row(
            f"{label}: MSE / Adam's best",
            ours["mse"] / adam["mse"],
            1.0,
            detail=f"full-data MSE after {e['budget_seconds']:.0f} s: ours {ours['mse']:.3g} "
            f"({ours['steps']} steps, {ours['attempts']} attempts, {sum(cg)} CG iterations), "
            f"Adam {adam['mse']:.3g} (lr {adam['lr']:g}, best of "
            f"{', '.join(format(a['lr'], 'g') for a in large['adam'])}); "
            f"start {large['initial_mse']:.3g}",
        )
    ]
    reg = e.get("regression")
    if reg is not None:
        lm, best = reg["lm"], min(reg["adam"], key=lambda a: a["mse"])
        rows.append(
            row(
                f"LM defaults {c.mlp_name(reg['widths'])} (P={reg['params']:,}) "
                f"N={reg['n']:,}: MSE / Adam's best",
                lm["mse"] / best["mse"],
                1.0,
                detail=f"full-data MSE after {e['budget_seconds']:.0f} s: ours {lm['mse']:.3g} "
                f"({lm['strategy']}, {lm['steps']} steps, {sum(lm['cg_iterations'])} CG "
                f"iterations), Adam {best['mse']:.3g} (lr {best['lr']:g}, best of "
                f"{', '.join(format(a['lr'], 'g') for a in reg['adam'])})",
            )
        )
    growth = large["rss"].get("growth_mib")
    rows.append(
        row(
            f"{label}: peak RSS growth of one step",
            growth,
            TARGET_RSS_MIB,
            unit=" MiB",
            detail=large["rss"].get("error", "a fresh process, one step"),
        )
    )
    medium = e.get("medium")
    if medium is not None:
        dense, free = medium["dense"], medium["matrix_free"]
        reached = free["seconds_to_goal"]
        spent = free["curve"][-1][0]
        dense_time = dense["curve"][-1][0]
        rows.append(
            row(
                f"matrix-free {c.mlp_name(medium['widths'])} (P={medium['params']:,}): "
                "time to the dense LM's MSE / dense",
                (reached if reached is not None else spent) / dense_time,
                1.0,
                bound="" if reached is not None else ">",
                detail=f"dense ({dense['strategy']}) MSE {dense['mse']:.3g} in "
                f"{dense_time:.0f} s ({dense['steps']} steps); matrix-free "
                + (f"reached it in {reached:.0f} s" if reached is not None else "did not reach it")
                + f" ({free['steps']} steps, MSE {free['mse']:.3g})",
            )
        )
    sinc = e["sinc"]
    rows.append(
        row(
            f"matrix-free sinc 1-{SINC_HIDDEN}-1 (P={sinc['params']}): MSE reached / 1e-5",
            sinc["mse"] / SINC_GOAL,
            1.0,
            detail=f"{sinc['steps']} steps"
            + (
                f", {sinc['seconds_to_goal']:.1f} s to 1e-5"
                if sinc["seconds_to_goal"] is not None
                else ", not reached"
            ),
        )
    )
    return rows


def section(e: dict[str, Any]) -> str:
    if "lm" in e:  # a run on a GPU
        return device_path.section(e)
    """The RESULTS.md section: the curves' end points, per side."""
    large = e["large"]
    lines = [
        f"1-minute load before → after: {e['load_before']:.1f} → {e['load_after']:.1f}.",
        "",
        "| problem | side | steps | full-data MSE |",
        "|---|---|---|---|",
        f"| {c.mlp_name(large['widths'])} | matrix-free LM | {large['matrix_free']['steps']} | "
        f"{_fmt(large['matrix_free']['mse'])} |",
    ]
    for a in large["adam"]:
        lines.append(
            f"| {c.mlp_name(large['widths'])} | Adam lr {a['lr']:g} | {a['steps']} | "
            f"{_fmt(a['mse'])} |"
        )
    reg = e.get("regression")
    if reg is not None:
        name = c.mlp_name(reg["widths"])
        lines.append(f"| {name} | LM ({reg['lm']['strategy']}) | {reg['lm']['steps']} | "
                     f"{_fmt(reg['lm']['mse'])} |")  # fmt: skip
        for a in reg["adam"]:
            lines.append(f"| {name} | Adam lr {a['lr']:g} | {a['steps']} | {_fmt(a['mse'])} |")
    medium = e.get("medium")
    if medium is not None:
        for side in ("dense", "matrix_free"):
            run = medium[side]
            lines.append(
                f"| {c.mlp_name(medium['widths'])} | {run['strategy']} LM | {run['steps']} | "
                f"{_fmt(run['mse'])} |"
            )
    sinc = e["sinc"]
    lines.append(
        f"| sinc 1-{SINC_HIDDEN}-1 | matrix-free LM | {sinc['steps']} | {_fmt(sinc['mse'])} |"
    )
    return "\n".join(lines)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it; on a GPU its device path
    (``_matrix_free_device.py``: the large network against Adam, ``budget`` seconds each)."""
    if torch.device(o.device).type == "cuda":
        return device_path.main(quick=o.quick, device=o.device, budget=o.budget or 10.0)
    if o.quick:
        return main(
            budget_seconds=8.0, dense_seconds=8.0, sinc_seconds=20.0, medium=False, quick=True
        )
    return main()
