"""Time to quality on the seed's sinc problem: our LM, torch-levenberg-marquardt and Adam.

Problem: 100000 points of ``y = sinc(10 x)`` on ``[-1, 1]``, a shuffled loader of batches
of 10000 (the same seed, hence the same batch sequence, for every optimizer), 1-64-1 and
1-256-1 tanh MLPs initialised from the same seed, float32, 2 threads. For each optimizer
the wall time of its training loop (fetching the batch and one step) is accumulated, and
after every LM step (every 10 Adam steps, one epoch) the clock is stopped and the MSE on
all 100000 points is evaluated, so that evaluation cost is outside the timed region for
every optimizer alike. Reported: the training time at which that MSE first reached
1e-3, 1e-4, 1e-5, 1e-6, or "not reached in X s" when the run hit its time cap (or the
optimizer declared it could go no further).

* ours: ``LMA(model, [cpu], a - b)`` with its defaults (Nielsen damping from 1e-3, Marquardt scaling);
* the peer: ``LevenbergMarquardtModule(model, solve_method="cholesky")`` with its default
  damping (the same numbers), one ``training_step`` per batch as its ``fit`` does;
* Adam: ``torch.optim.Adam`` on the batch MSE; the learning rate is the best of a small
  grid, each tried for a short time (the lowest full-dataset MSE at the end wins). Adam's
  cap is at least ``ADAM_CAP_SECONDS`` and, when ours reached 1e-4, 10.5× our time to it
  (at most ``ADAM_CAP_MAX_SECONDS``): Adam not reaching 1e-4 within its cap then decides
  the 10× target instead of leaving it open.

Each run is a fresh process. Targets: every threshold at ≤ 0.5× the peer's time; 1e-4
at least 10× sooner than Adam. Each run is traced by ``_quality_trace.py``. On a GPU
(``--device cuda``): the 1-64-1 network, ours (``slice_size=5000``) against the peer, the
batches moved to the device each step, capped at half the budget each.
``python benchmarks/run_all.py quality [--device cuda]``; ``main()`` writes
``results/quality.png``.
"""

from __future__ import annotations

from typing import Any

import _child
import _common as c
import _machine
import torch
from _quality_trace import THRESHOLDS
from _registry import Options
from _rows import Row, time_ratio

HIDDEN_SIZES = (64, 256)
#: On a GPU: the tutorial's network, ours against the peer (no Adam), within the budget.
GPU_HIDDEN_SIZES = (64,)
GPU_CAP_SECONDS = 60.0
CAP_SECONDS = 75.0
ADAM_CAP_SECONDS = 45.0
ADAM_CAP_MAX_SECONDS = 240.0
ADAM_GRID = (1e-3, 3e-3, 1e-2, 3e-2)
ADAM_TUNE_SECONDS = 4.0
#: The runs of each network, in the order of the tables and the plot.
SIDES = ("ours", "peer", "adam")
COLORS = ("#4c72b0", "#dd8452", "#55a868")
TARGET_PEER = 0.5
TARGET_ADAM = 10.0
ADAM_THRESHOLD = 1e-4


def _traced(
    kind: str, hidden: int, cap: float, lr: float | None, device: str = "cpu"
) -> dict[str, Any]:
    """``_quality_trace.trace_run`` in a process of its own; its failure as a result."""
    args = [kind, hidden, cap, lr, device]
    result, error = _child.call("_quality_trace", "trace_run", args, timeout=cap + 120)
    if result is None:
        return {
            "kind": kind,
            "hidden": hidden,
            "lr": lr,
            "error": error,
            "cap_seconds": cap,
            "reached": {f"{t:g}": None for t in THRESHOLDS},
            "trace": [],
            "steps": 0,
            "final_mse": None,
            "stopped": error,
            "train_seconds": 0.0,
        }
    return result


def _adam_cap(ours: dict[str, Any], floor: float, ceiling: float) -> float:
    """Adam's time cap: long enough for its miss to decide the speed-up target."""
    t_ours = ours["reached"].get(f"{ADAM_THRESHOLD:g}")
    if t_ours is None:
        return floor
    return max(floor, min(ceiling, 1.05 * TARGET_ADAM * float(t_ours)))


def main(
    cap: float = CAP_SECONDS,
    adam_cap: float = ADAM_CAP_SECONDS,
    adam_cap_max: float = ADAM_CAP_MAX_SECONDS,
    tune: float = ADAM_TUNE_SECONDS,
    hidden_sizes: tuple[int, ...] = HIDDEN_SIZES,
    quick: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """Every run of every network (Adam's only on the CPU); writes ``results/quality.png``."""
    gpu = torch.device(device).type == "cuda"
    results: dict[str, Any] = {
        "problem": "sinc(10x), 100000 points, shuffled batches of 10000, float32, "
        + (f"on {device}" if gpu else f"{c.THREADS} threads")
        + "; MSE on all 100000 points",
        "thresholds": list(THRESHOLDS),
        "caps_seconds": {
            "lm": cap,
            "adam": adam_cap,
            "adam_max": adam_cap_max,
            "adam_tuning": tune,
        },
        "adam_grid": list(ADAM_GRID),
        "load_average": {"before": _machine.load_average()},
        "models": {},
    }
    for hidden in hidden_sizes:
        entry: dict[str, Any] = {}
        entry["ours"] = _traced("ours", hidden, cap, None, device)
        entry["peer"] = _traced("peer", hidden, cap, None, device)
        if gpu:
            results["models"][f"1-{hidden}-1"] = entry
            continue
        tuning = {lr: _traced("adam", hidden, tune, lr) for lr in ADAM_GRID}
        finals = {lr: r["final_mse"] for lr, r in tuning.items() if r["final_mse"] is not None}
        best = min(finals, key=lambda lr: finals[lr]) if finals else ADAM_GRID[0]
        entry["adam_tuning"] = {
            f"{lr:g}": {"final_mse": r["final_mse"], "steps": r["steps"]}
            for lr, r in tuning.items()
        }
        entry["adam_lr"] = best
        entry["adam"] = _traced(
            "adam", hidden, _adam_cap(entry["ours"], adam_cap, adam_cap_max), best
        )
        results["models"][f"1-{hidden}-1"] = entry
    results["load_average"]["after"] = _machine.load_average()
    _plot(results, f"quality{c.suffix(quick, device)}.png")
    return results


def _label(run: dict[str, Any], t: str) -> str:
    value = run["reached"].get(t)
    if value is not None:
        return f"{value:.1f} s"
    return f"not reached in {run['train_seconds']:.0f} s"


def rows(results: dict[str, Any]) -> list[Row]:
    """Per network and threshold, our time over the peer's; Adam's time to 1e-4 over ours."""
    rows = []
    for name, entry in results["models"].items():
        ours, peer = entry["ours"], entry["peer"]
        for thr in results["thresholds"]:
            t = f"{thr:g}"
            o, p = ours["reached"].get(t), peer["reached"].get(t)
            detail = f"ours {_label(ours, t)}, peer {_label(peer, t)}"
            rows.append(
                time_ratio(
                    f"quality {name} MSE {t}: ours / peer",
                    (o, p),
                    (ours["train_seconds"], peer["train_seconds"]),
                    TARGET_PEER,
                    detail=detail + (" (neither reached it)" if o is None and p is None else ""),
                )
            )
        if "adam" not in entry:  # a GPU run: ours against the peer only
            continue
        adam, t = entry["adam"], f"{ADAM_THRESHOLD:g}"
        rows.append(
            time_ratio(
                f"quality {name} MSE {t}: Adam / ours (speed-up)",
                (adam["reached"].get(t), ours["reached"].get(t)),
                (adam["train_seconds"], ours["train_seconds"]),
                TARGET_ADAM,
                op="≥",
                detail=f"ours {_label(ours, t)}, Adam (lr {entry['adam_lr']:g}) {_label(adam, t)}",
            )
        )
    return rows


@c.plot
def _plot(plt: Any, results: dict[str, Any]) -> Any:
    models = results["models"]
    # One panel above the other: the figure stays readable at the docs' column width.
    fig, axes = plt.subplots(len(models), 1, figsize=(7, 3.6 * len(models)), squeeze=False)
    for ax, (name, entry) in zip(axes[:, 0], models.items(), strict=True):
        for key, label, color in zip(SIDES, _labels(entry), COLORS, strict=False):
            trace = entry[key].get("trace") or []
            if trace:
                ts = [max(t, 1e-2) for t, _s, _m in trace]
                ax.plot(ts, [m for _t, _s, m in trace], label=label, color=color)
        for thr in results["thresholds"]:
            ax.axhline(thr, color="#cccccc", lw=0.6, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("training wall time (s, evaluation excluded)")
        ax.set_ylabel("MSE on all 100000 points")
        ax.set_title(f"sinc(10x), {name} tanh MLP", fontsize=10)
        ax.legend(fontsize=8)
    return fig


def echo(results: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    print(results["problem"])
    for name, entry in results["models"].items():
        for key in SIDES[: len(_labels(entry))]:
            r = entry[key]
            times = ", ".join(f"{t}: {_label(r, t)}" for t in r["reached"])
            extra = f" lr {r['lr']:g}" if r.get("lr") else ""
            print(
                f"  {name} {key}{extra}: {r['steps']} steps, final MSE {r['final_mse']}, "
                f"stopped: {r['stopped']}; {times}"
            )
        if "adam_tuning" not in entry:
            continue
        print(
            f"  {name} Adam tuning ({results['caps_seconds']['adam_tuning']:g} s each): "
            + ", ".join(
                f"lr {k}: {v['final_mse']:.3g}"
                for k, v in entry["adam_tuning"].items()
                if v["final_mse"] is not None
            )
        )


def _labels(entry: dict[str, Any]) -> list[str]:
    """The labels of an entry's runs, in ``SIDES``' order (no Adam in a GPU run's)."""
    adam = [f"Adam (lr {entry['adam_lr']:g})"] if "adam" in entry else []
    return ["marquardt LMA", "torch-levenberg-marquardt", *adam]


def _fmt_s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def section(q: dict[str, Any]) -> str:
    thresholds = [f"{t:g}" for t in q["thresholds"]]
    out = [
        "| model | optimizer | steps | "
        + " | ".join(f"MSE {t}" for t in thresholds)
        + " | final MSE | stopped |",
        "|---|---|---|" + "---|" * len(thresholds) + "---|---|",
    ]
    for _name, entry in q["models"].items():
        for key, label in zip(SIDES, _labels(entry), strict=False):
            run = entry[key]
            cells = [
                _fmt_s(run["reached"].get(t))
                if run["reached"].get(t) is not None
                else f"not in {run['train_seconds']:.0f} s"
                for t in thresholds
            ]
            final = "—" if run.get("final_mse") is None else f"{run['final_mse']:.2e}"
            out.append(
                f"| 1-{entry['ours']['hidden']}-1 | {label} | {run['steps']} | "
                + " | ".join(cells)
                + f" | {final} | {run['stopped']} |"
            )
    tuning = "; ".join(
        f"{name}: "
        + ", ".join(
            f"lr {k} → {v['final_mse']:.2e}"
            for k, v in e["adam_tuning"].items()
            if v["final_mse"] is not None
        )
        for name, e in q["models"].items()
        if "adam_tuning" in e
    )
    caps = q["caps_seconds"]
    return (
        "\n".join(out)
        + f"\n\nCaps: {caps['lm']:g} s of training per LM run; for Adam {caps['adam']:g} s, or "
        f"10.5× our time to 1e-4 when that is longer (at most {caps.get('adam_max', caps['adam']):g} "
        f"s), after a {caps['adam_tuning']:g} s trial of each learning rate (lowest full-dataset MSE wins): "
        f"{tuning}. Times exclude the full-dataset MSE evaluations (the clock stops for them)."
    )


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    if o.quick:
        return main(
            cap=8.0,
            adam_cap=5.0,
            adam_cap_max=5.0,
            tune=1.0,
            hidden_sizes=(64,),
            quick=True,
            device=o.device,
        )
    if torch.device(o.device).type == "cuda":
        cap = GPU_CAP_SECONDS if o.budget is None else o.budget / 2
        return main(cap=cap, hidden_sizes=GPU_HIDDEN_SIZES, device=o.device)
    return main()
