"""The Jacobian planner's choices against every forced alternative.

For each shape the planner (``JacobianEngine.plan`` with ``strategy="auto"``, mode
``"auto"``) picks a strategy (``accumulate``: sum JᵀJ, Jᵀr slice by slice; ``explicit``:
hold J) and a Jacobian mode (``layers``, ``vmap``, ``jacfwd``). Every combination is then
forced and timed doing the part of an LM step that the choice changes: build the linear
system (Jacobian and its products, handed to the backend ``LMA`` uses by default here)
and one damped solve. Trial forwards are the same for every choice and are left out.
The peak resident-memory growth of each combination is measured too (Linux
``clear_refs``), and a combination "fits" when that stays within the planner's memory
budget. A combination whose single call on a tenth of the rows projects to more than
``LIMIT_SECONDS`` is reported by that projection and not repeated (forward mode over
hundreds of parameters is the case).

Shapes: sinc 1-256-1 (P = 769) with N = 10000 (rows ≥ P); the same model with N = 500
(rows < P, the under-determined form); a 2-32-32-3 tanh MLP (P = 1251, m = 3 outputs
per sample) with N = 2000 (6000 rows). float32, 2 threads.

Target: the planner's choice within 1.1× of the fastest combination that fits.
``python benchmarks/run_all.py strategy``; ``main()`` writes ``results/strategy.png``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import _common as c
import _machine
import torch
from _registry import Options
from _rows import row
from torch import nn

from marquardt.testing.problems import sinc

STRATEGIES = ("accumulate", "explicit")
MODES = ("layers", "vmap", "jacfwd")
REPEATS = 3
LIMIT_SECONDS = 20.0
TARGET = 1.1


def _multi_output_problem(n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(c.SEED)
    model = nn.Sequential(
        nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3)
    )
    x = torch.rand(n, 2) * 2 - 1
    y = torch.stack(
        [
            torch.sin(3 * x[:, 0] + x[:, 1]),
            torch.cos(2 * x[:, 0] * x[:, 1]),
            x[:, 0] ** 2 - x[:, 1],
        ],
        dim=1,
    )
    return model, x, y


def shapes() -> dict[str, tuple[Callable[[], nn.Module], torch.Tensor, torch.Tensor]]:
    x10k, y10k = sinc(10_000)
    x500, y500 = sinc(500)
    _m, xm, ym = _multi_output_problem(2000)
    return {
        "sinc 1-256-1, N=10000 (rows ≥ P)": (lambda: c.sinc_model(256), x10k, y10k),
        "sinc 1-256-1, N=500 (rows < P)": (lambda: c.sinc_model(256), x500, y500),
        "2-32-32-3 MLP, m=3, N=2000": (lambda: _multi_output_problem(1)[0], xm, ym),
    }


def _measure(
    make_model: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, strategy: str, mode: str
) -> dict[str, Any]:
    from marquardt.jacobian import JacobianEngine, Replicas
    from marquardt.solver import LMA

    model = make_model()
    backend = LMA(make_model(), [torch.device("cpu")], lambda a, b: a - b).backend
    engine = JacobianEngine(Replicas(model, [torch.device("cpu")]), lambda a, b: a - b, mode=mode)
    params = sum(p.numel() for p in model.parameters())

    def step(xs: torch.Tensor, ys: torch.Tensor) -> None:
        rows = int(ys.numel())
        if strategy == "accumulate":
            system = backend.system_from_products(engine.accumulate(xs, ys))
        else:
            system = backend.system_from_slices(engine.slices(xs, ys), rows, params)
        backend.solve(system, 1e-3, "identity")
        backend.synchronize()

    # One-time set-up (layer-rule check, kernel choice, first-call allocations) happens
    # on a few samples first, so that the probe on a tenth of the rows times the work.
    step(x[:16], y[:16])
    tenth = max(1, int(x.shape[0]) // 10)
    start = time.perf_counter()
    step(x[:tenth], y[:tenth])
    projected = (time.perf_counter() - start) * int(x.shape[0]) / tenth
    plan = engine.last_plan
    out: dict[str, Any] = {
        "strategy": strategy,
        "mode": plan.mode if plan else mode,
        "plan": plan.reason if plan else "",
        "memory_budget_mib": plan.memory_budget / 2**20 if plan else None,
    }
    if projected > LIMIT_SECONDS:
        out.update(seconds=projected, projected=True, peak_growth_mib=None)
        return out
    start = time.perf_counter()
    peak = _machine.peak_growth_mib(lambda: step(x, y))
    first = time.perf_counter() - start
    # A slow combination is timed once: repeating it would only cost minutes.
    times = c.time_calls(lambda: step(x, y), REPEATS, warmup=0) if first < 2.0 else [first]
    plan = engine.last_plan
    out.update(
        seconds=c.median(times),
        projected=False,
        peak_growth_mib=peak,
        memory_budget_mib=plan.memory_budget / 2**20 if plan else None,
    )
    return out


def main(quick: bool = False) -> dict[str, Any]:
    """Every shape, strategy and mode; ``quick`` names the plot apart (the sizes are the
    same)."""
    c.setup_threads()
    from marquardt.jacobian import JacobianEngine, Replicas

    results: dict[str, Any] = {
        "problem": f"build the LM system and solve once, float32, {c.THREADS} threads, "
        "slice_size=None (one device)",
        "load_average": {"before": _machine.load_average()},
        "shapes": {},
    }
    for name, (make_model, x, y) in shapes().items():
        engine = JacobianEngine(Replicas(make_model(), [torch.device("cpu")]), lambda a, b: a - b)
        plan = engine.plan(x, y, strategy="auto")
        combos = {f"{s}/{m}": _measure(make_model, x, y, s, m) for s in STRATEGIES for m in MODES}
        chosen = f"{plan.strategy}/{plan.mode}"
        fitting = {
            k: v
            for k, v in combos.items()
            if v["peak_growth_mib"] is not None
            and (v["memory_budget_mib"] is None or v["peak_growth_mib"] <= v["memory_budget_mib"])
        }
        fastest = min(fitting, key=lambda k: fitting[k]["seconds"]) if fitting else None
        results["shapes"][name] = {
            "rows": plan.rows,
            "params": plan.params,
            "outputs_per_sample": plan.outputs_per_sample,
            "planner_choice": chosen,
            "planner_reason": plan.reason,
            "combinations": combos,
            "fastest_that_fits": fastest,
            "ratio_choice_vs_fastest": (
                combos[chosen]["seconds"] / fitting[fastest]["seconds"]
                if fastest and chosen in combos
                else None
            ),
        }
    results["load_average"]["after"] = _machine.load_average()
    _plot(results, f"strategy{c.suffix(quick)}.png")
    return results


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The ratios with their targets, for the aggregate table."""
    rows = []
    for name, entry in results["shapes"].items():
        chosen, fastest = entry["planner_choice"], entry["fastest_that_fits"]
        combos = entry["combinations"]
        detail = (
            f"planner {chosen} {combos[chosen]['seconds'] * 1e3:.0f} ms; fastest that fits "
            f"{fastest} {combos[fastest]['seconds'] * 1e3:.0f} ms"
            if fastest
            else "none fits"
        )
        rows.append(
            row(
                f"strategy: planner / fastest, {name}",
                entry["ratio_choice_vs_fastest"],
                TARGET,
                detail=detail,
            )
        )
    return rows


@c.plot
def _plot(plt: Any, results: dict[str, Any]) -> Any:
    shapes_ = results["shapes"]
    fig, axes = plt.subplots(1, len(shapes_), figsize=(5 * len(shapes_), 3.6), squeeze=False)
    for ax, (name, entry) in zip(axes[0], shapes_.items(), strict=True):
        labels = list(entry["combinations"])
        values = [entry["combinations"][k]["seconds"] for k in labels]
        colors = [
            "#c44e52"
            if k == entry["planner_choice"]
            else "#bbbbbb"
            if entry["combinations"][k]["projected"]
            else "#4c72b0"
            for k in labels
        ]
        ax.barh(labels, values, color=colors)
        ax.set_xscale("log")
        ax.set_xlabel("seconds (red: planner's choice; grey: projected)")
        ax.set_title(name, fontsize=9)
    return fig


def echo(results: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    print(results["problem"])
    for name, entry in results["shapes"].items():
        print(
            f"  {name}: rows {entry['rows']}, P {entry['params']}; planner: "
            f"{entry['planner_choice']}"
        )
        for k, v in entry["combinations"].items():
            mem = "—" if v["peak_growth_mib"] is None else f"{v['peak_growth_mib']:.0f} MiB"
            tag = " (projected from a tenth of the rows)" if v["projected"] else ""
            print(f"    {k:20s} {v['seconds'] * 1e3:9.1f} ms  peak {mem}{tag}")


def section(s: dict[str, Any]) -> str:
    out = []
    for name, entry in s["shapes"].items():
        out.append(
            f"**{name}** — rows {entry['rows']}, P {entry['params']}, m "
            f"{entry['outputs_per_sample']}; planner: `{entry['planner_choice']}` "
            f"({entry['planner_reason']})\n"
        )
        out.append("| strategy/mode | seconds | peak growth |\n|---|---|---|")
        for k, v in entry["combinations"].items():
            mark = " ← planner" if k == entry["planner_choice"] else ""
            mem = "—" if v["peak_growth_mib"] is None else f"{v['peak_growth_mib']:.0f} MiB"
            proj = " (projected)" if v["projected"] else ""
            out.append(f"| {k}{mark} | {v['seconds']:.3f}{proj} | {mem} |")
        out.append("")
    return "\n".join(out)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(quick=o.quick)
