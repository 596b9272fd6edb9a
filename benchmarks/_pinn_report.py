"""The report of ``bench_pinn.py``: its rows against their targets, its section of
RESULTS.md and its figures (error against wall time, the error field).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from typing import Any

from _common import HERE, RESULTS_DIR, pyplot
from _rows import Row, row


def _error_at(trace: list[list[float]], t: float) -> float:
    """The error a method had reached by time ``t`` (its last evaluation not after ``t``)."""
    best = trace[0][1]
    for when, err in trace:
        if when <= t:
            best = err
    return best


def run_rows(runs: dict[str, Any]) -> list[Row]:
    """The comparison's rows with their targets, from each method's run (None: failed)."""
    ours = runs["ours"]
    rows: list[Row] = []
    if ours:
        final = ours["trace"][-1][1]
        rows.append(row("ours: relative L2 error at the budget", final, 1e-5, unit=""))
        for other, target in (("adam", 0.01), ("lbfgs", 0.1)):
            if runs.get(other):
                t = ours["trace"][-1][0]
                theirs = _error_at(runs[other]["trace"], t)
                rows.append(
                    row(
                        f"error ratio ours / {other} at {t:.0f} s",
                        final / theirs,
                        target,
                        detail=f"{final:.3g} vs {theirs:.3g}",
                    )
                )
        if runs.get("peer"):
            peer = runs["peer"]
            rows.append(
                row(
                    "step time ours / torch-levenberg-marquardt",
                    ours["step_median_s"] / peer["step_median_s"],
                    0.5,
                    detail=f"{ours['step_median_s'] * 1e3:.1f} ms vs {peer['step_median_s'] * 1e3:.1f} ms",
                )
            )
            rows.append(
                row(
                    "peak memory ours / torch-levenberg-marquardt",
                    ours["memory_mib"] / max(peer["memory_mib"], 1e-9),
                    1.0,
                    detail=f"{ours['memory_mib']:.0f} MiB vs {peer['memory_mib']:.0f} MiB",
                )
            )
            rows.append(
                row(
                    "error ratio ours / torch-levenberg-marquardt",
                    ours["trace"][-1][1] / peer["trace"][-1][1],
                    None,
                    detail=f"{ours['trace'][-1][1]:.3g} vs {peer['trace'][-1][1]:.3g}",
                )
            )
    return rows


def summary(results: dict[str, Any]) -> list[Row]:
    """The rows of the comparison, with their targets (recorded in the results), and, for a
    CPU's results, the step by the Jacobian's path (``_pinn_step.py``'s, where recorded)."""
    extra = step_rows() + engd_rows() if _on_cpu(results) else []
    return [Row.load(r) for r in results["rows"]] + extra


def _on_cpu(results: dict[str, Any]) -> bool:
    """Whether ``results`` are a CPU's: only their report shows the step by the Jacobian's
    path, whose figures are the CPU's."""
    return "gpu" not in results["machine"]


def _step_results() -> dict[str, Any] | None:
    path = RESULTS_DIR / "pinn_step.json"
    return json.loads(path.read_text()) if path.exists() else None


def step_rows() -> list[Row]:
    """Per shape: the step with the forward Laplacian / the step with ``torch.func.hessian``."""
    steps = _step_results()
    if steps is None:
        return []
    out = []
    for shape in steps["shapes"]:
        ours, earlier = shape["median_s"].values()
        out.append(
            row(
                f"PINN step, forward Laplacian / torch.func.hessian: {shape['label']}",
                shape["ratio"],
                steps["target"],
                detail=f"{ours * 1e3:.0f} ms vs {earlier * 1e3:.0f} ms (P = {shape['params']:,}, "
                f"{shape['rows']:,} rows)",
            )
        )
    return [dataclasses.replace(r, source="pinn_step") for r in out]


def _engd_results() -> dict[str, Any] | None:
    path = RESULTS_DIR / "pinn_engd.json"
    return json.loads(path.read_text()) if path.exists() else None


def engd_rows() -> list[Row]:
    """ENGD's Poisson (``_pinn_engd.py``): seconds to 1e-6 (≤ 3), the error at the budget
    (≤ 1e-7), the step with geodesic acceleration and with the defaults (≤ 5 ms)."""
    engd = _engd_results()
    if engd is None:
        return []
    fit, steps = engd["fit"], engd["step_s"]
    reached = fit["reached"].get("1e-06")
    floor = f"floor (J, JᵀJ, Cholesky) {steps['floor'] * 1e3:.1f} ms"
    rows = [
        row(
            "ENGD Poisson (P = 129, 900 rows): seconds to relative L2 1e-6",
            reached[0] if reached else engd["budget_s"],
            3.0,
            bound="" if reached else ">",
            unit=" s",
            detail=f"{reached[1]} steps" if reached else "not reached",
        ),
        row(
            f"ENGD Poisson: relative L2 error at {engd['budget_s']:.0f} s",
            fit["final"],
            1e-7,
            unit="",
            detail=f"{fit['steps']} steps",
        ),
        row(
            "ENGD Poisson: one LM step, geodesic acceleration",
            steps["geodesic"] * 1e3,
            5.0,
            unit=" ms",
            detail=f"{steps['geodesic_parts']}; {floor}",
        ),
        row(
            "ENGD Poisson: one LM step, defaults",
            steps["defaults"] * 1e3,
            5.0,
            unit=" ms",
            detail=f"{steps['defaults_parts']}; {floor}",
        ),
    ]
    if "pinn_step_compiled" in steps:
        eager, compiled = steps["pinn_step_eager"], steps["pinn_step_compiled"]
        rows.append(
            row(
                "ENGD Poisson: PinnStep's system and solve, compiled / eager (off by default)",
                compiled / eager,
                None,
                detail=f"{compiled * 1e3:.2f} ms vs {eager * 1e3:.2f} ms, in turn; compile "
                f"{steps['pinn_step_compile_s']:.1f} s; no trial forward; {floor}",
            )
        )
    return [dataclasses.replace(r, source="pinn_engd") for r in rows]


def device_step_rows(step: dict[str, Any] | None) -> list[Row]:
    """A GPU run's `PinnStep` (``_pinn_engd.device_steps``): compiled / eager, no target
    (the CPU's row has none either); nothing where the run did not measure it."""
    if step is None:
        return []
    label = "PINN step on the device, ENGD Poisson (P = 129, 900 rows): PinnStep compiled / eager"
    if "error" in step:
        return [row(label, None, None, detail=f"did not complete: {step['error']}")]
    eager, compiled = step["pinn_step_eager"], step["pinn_step_compiled"]
    return [
        row(
            label,
            compiled / eager,
            None,
            detail=f"{compiled * 1e3:.2f} ms vs {eager * 1e3:.2f} ms, in turn, medians of "
            f"{step['repeats']}; compile {step['pinn_step_compile_s']:.1f} s; compiled ran: "
            f"{bool(step['pinn_step_compiled_ran'])}",
        )
    ]


def device_step_text(step: dict[str, Any] | None) -> str:
    """A GPU run's `PinnStep` in one sentence ("" where the run did not measure it)."""
    if step is None:
        return ""
    if "error" in step:
        return f"`PinnStep` on the device did not complete: {step['error']}."
    eager, compiled = step["pinn_step_eager"], step["pinn_step_compiled"]
    return (
        f"ENGD's Poisson (P = 129, 900 rows) on the device as one function (`PinnStep`, "
        f"`_pinn_engd.py`), medians of {step['repeats']} in turn: eager {eager * 1e3:.2f} ms, "
        f"compiled {compiled * 1e3:.2f} ms ({compiled / eager:.2f}×) after a compile of "
        f"{step['pinn_step_compile_s']:.1f} s."
    )


def _pinn_step_text(steps: dict[str, Any]) -> str:
    """The sentence on `PinnStep`, eager and compiled, where the run measured it."""
    if "pinn_step_compiled" not in steps:
        return ""
    eager, compiled = steps["pinn_step_eager"], steps["pinn_step_compiled"]
    return (
        f" The same system as one function (`PinnStep`): eager {eager * 1e3:.1f} ms, compiled "
        f"{compiled * 1e3:.1f} ms ({compiled / eager:.2f}×) after a compile of "
        f"{steps['pinn_step_compile_s']:.1f} s."
    )


def section(results: dict[str, Any]) -> str:
    """RESULTS.md's section: one line per method, the Jacobian orders, the figures."""
    m = results["machine"]
    lines = [
        f"2-D Poisson, 2-32-32-1 tanh (P = {results['runs']['ours']['params']:,}), "
        f"{results['runs']['ours']['rows']:,} collocation rows, float64, "
        f"{results['budget_s']:.0f} s per method; {m['cpu']}, load {m['load_average_1min']:.1f} "
        f"at the start; Adam's learning rate {results['adam_lr']:g} (tuned over "
        f"{', '.join(results['adam_tuning'])}).",
        "",
        "| method | relative L2 error | steps | step (median) | peak RSS growth |",
        "|---|---|---|---|---|",
    ]
    for name, r in results["runs"].items():
        if r is None:
            lines.append(f"| {name} | failed | | | |")
            continue
        lines.append(
            f"| {name} | {r['trace'][-1][1]:.3g} | {r['steps']} | "
            f"{r['step_median_s'] * 1e3:.1f} ms | {r['memory_mib']:.0f} MiB |"
        )
    orders_path = RESULTS_DIR / "pinn_orders.json"
    if orders_path.exists():
        orders = json.loads(orders_path.read_text())["orders"]
        lines += [
            "",
            "Jacobian orders (`_pinn_orders.py`): one J (explicit) and one JᵀJ (accumulate) of the same "
            "residual, by the order over θ and the order of the input Hessian:",
            "",
            "| input Hessian | over θ | J | JᵀJ |",
            "|---|---|---|---|",
        ]
        for o in orders:
            lines.append(
                f"| {o['hessian']} | {o['order_over_theta']} | {o['explicit_s'] * 1e3:.0f} ms | "
                f"{o['accumulate_s'] * 1e3:.0f} ms |"
            )
    steps = _step_results() if _on_cpu(results) else None
    if steps is not None:
        m = steps["machine"]
        lines += [
            "",
            "The LM step by the Jacobian's path (`_pinn_step.py`): the forward Laplacian against "
            "`torch.func.hessian` at every point, the same weights and points, steps taken in "
            f"turn, medians of {steps['shapes'][0]['steps']}; {m['cpu']}, load "
            f"{steps['load_before']:.1f} → {steps['load_after']:.1f}:",
            "",
            "| shape | P | rows | forward Laplacian | torch.func.hessian | ratio | Gram floor "
            "(`syrk` + Cholesky) | parts (ours; earlier) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for shape in steps["shapes"]:
            ours, earlier = shape["median_s"].values()
            parts = "; ".join(shape["parts"].values())
            lines.append(
                f"| {shape['label']} | {shape['params']:,} | {shape['rows']:,} | "
                f"{ours * 1e3:.0f} ms | {earlier * 1e3:.0f} ms | {shape['ratio']:.2f}× | "
                f"{shape['gram_floor_s'] * 1e3:.0f} ms | {parts} |"
            )
    engd = _engd_results() if _on_cpu(results) else None
    if engd is not None:
        m, fit = engd["machine"], engd["fit"]
        marks = ", ".join(f"{k} at {v[0]:.2f} s ({v[1]} steps)" for k, v in fit["reached"].items())
        lines += [
            "",
            "ENGD's Poisson (`_pinn_engd.py`; 2-32-1 tanh, P = 129, 784 + 116 rows, float64, "
            f"LM with geodesic acceleration 0.75 and `scaling_memory=1`, {engd['budget_s']:.0f} s; "
            f"{m['cpu']}, load {engd['load_before']:.1f} → {engd['load_after']:.1f}): "
            f"{marks or 'no mark reached'}; {fit['final']:.2g} after {fit['steps']} steps. "
            f"Steps (medians of {engd['repeats']}): geodesic {engd['step_s']['geodesic'] * 1e3:.1f} ms, "
            f"defaults {engd['step_s']['defaults'] * 1e3:.1f} ms, the floor (J by the "
            f"{engd['step_s']['floor_mode']} mode, JᵀJ, Cholesky, timed alone) "
            f"{engd['step_s']['floor'] * 1e3:.1f} ms.{_pinn_step_text(engd['step_s'])}",
        ]
    if results.get("pinn_step"):
        lines += ["", device_step_text(results["pinn_step"])]
    lines += [
        "",
        "![error against wall time](../docs/img/pinn_error_time.png)",
        "",
        "![error field](../docs/img/pinn_error_field.png)",
    ]
    return "\n".join(lines)


def figures(runs: dict[str, Any], suffix: str, results: dict[str, Any]) -> None:
    """The error against wall time and the error field, into ``results/`` with ``suffix``
    in their names (``_common.suffix``); the recorded ones (no suffix) also into docs/img."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    labels = {
        "ours": "marquardt LMA (PointResidual)",
        "peer": "torch-levenberg-marquardt",
        "lbfgs": "torch.optim.LBFGS",
        "adam": f"Adam (lr {results.get('adam_lr', 0):g})",
    }
    for name, label in labels.items():
        r = runs.get(name)
        if r:
            t, e = zip(*r["trace"], strict=True)
            ax.semilogy(t, e, label=label, drawstyle="steps-post")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("relative L2 error of u")
    ax.set_title("2-D Poisson PINN, same network and points")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    time_png = RESULTS_DIR / f"pinn_error_time{suffix}.png"
    fig.savefig(time_png, dpi=110)
    plt.close(fig)
    ours = runs.get("ours")
    if not ours or "error_field" not in ours:
        return
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    field = ours["error_field"]
    im = ax.imshow(field, origin="lower", extent=(0, 1, 0, 1), cmap="RdBu_r")
    fig.colorbar(im, ax=ax, label="u_θ − u")
    ax.set_xlabel("y")
    ax.set_ylabel("x")
    ax.set_title(f"error field after {ours['trace'][-1][0]:.0f} s of LM")
    fig.tight_layout()
    field_png = RESULTS_DIR / f"pinn_error_field{suffix}.png"
    fig.savefig(field_png, dpi=110)
    plt.close(fig)
    if not suffix:
        docs = HERE.parent / "docs" / "img"
        shutil.copy(time_png, docs / time_png.name)
        shutil.copy(field_png, docs / field_png.name)
