"""The PINN problem suite (``pinn_suite.py``): LM against Adam, L-BFGS and Adam then
L-BFGS on every problem, with the same network, the same collocation points and the same
wall-clock budget per method, beside the figures the literature publishes.

Methods (each in its own process, float64, the problem's tanh network from one seed):

* ``lm``: ``LMA(model, [cpu], residual)`` with its defaults, on fixed points;
* ``lm_resample``: the same on ``Collocation`` points, a quarter of them redrawn every
  step (the rows and the other settings as ``lm``'s);
* ``adam``: Adam at 1e-3 (the rate of Raissi et al. 2019 and of DeepXDE's examples) on the
  mean squared residual;
* ``lbfgs``: ``torch.optim.LBFGS`` (strong Wolfe line search, history 50);
* ``adam_lbfgs``: Adam for half the budget, then L-BFGS (the schedule of DeepXDE, Lu et
  al. 2021, and of most PINN papers);
* ``lm_tutorial``, ``lm_hard``, ``lm_causal``, ``lm_periodic``, ``lm_periodic_causal``,
  ``lm_periodic_march``, ``lm_hard_rad``, ``lm_windows`` (only when named in ``main``'s
  ``methods``): ``lm`` with the switches its name lists (``_pinn_lm.py``: geodesic
  acceleration, conditions built in, causal weights annealed, a periodic network, time
  marching, residual-based points, Allen–Cahn's windows with the initial condition built
  into each), each only on the problems that have what it needs.

The clock excludes the error evaluations. The error is the problem's relative L2 error
against its reference (for the inverse problem: the coefficient's relative error). Writes
``results/pinn_suite.json`` and prints the rows with their targets (LM ≤ 1e-6 on Poisson,
heat and the inverse heat problem, ≤ 1e-3 on Allen–Cahn, ≤ 1e-4 elsewhere, and ≤ 1/100 of the best first-order
method's error). ``helmholtz_wide`` (``pinn_suite.LARGE``, only when named) is Helmholtz on
a network of P = 132,609: its row is LM / Adam at equal time (≤ 1).

    python benchmarks/run_all.py pinn_suite --budget 25
    python benchmarks/_child.py bench_pinn_suite main '[10, ["heat"], ["lm"], true]'
    python benchmarks/_child.py bench_pinn_suite main '[300, ["helmholtz_wide"], ["lm", "adam"], true]'

(the second reruns LM on the heat problem into the recorded results: ``main``'s budget,
problems, methods and ``update``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from typing import Any

import _child
import _first_order as first_order
import _machine
import _pinn_lm
import pinn_suite
import torch
from _common import RESULTS_DIR, setup_threads, write_json
from _registry import Options
from _rows import Row, row

METHODS = ("lm", "lm_resample", "adam", "lbfgs", "adam_lbfgs")
#: Run only when named in ``main``'s ``methods``: LM with switches (``_pinn_lm.py``).
EXTRA_METHODS = tuple(m for m in _pinn_lm.SWITCHES if m not in METHODS)
LM_METHODS = tuple(_pinn_lm.SWITCHES)
FIRST_ORDER = ("adam", "lbfgs", "adam_lbfgs")
#: LM's error target by problem (the easy three ≤ 1e-6, Allen–Cahn ≤ 1e-3 (the PINN issue's;
#: 1e-4 is its goal beyond), the others ≤ 1e-4).
LM_TARGET = {"poisson": 1e-6, "heat": 1e-6, "heat_inverse": 1e-6, "allen_cahn": 1e-3}
ADAM_LR = 1e-3
#: The switches the suite takes as LM's configuration where they did better than the
#: defaults in its runs (Burgers: its conditions built in, 7.6e-5 against 2.4e-4 at 300 s;
#: with residual-based points as well, 6.65e-5 at 300 s); Allen–Cahn: its windows with the
#: initial condition built into each (`pinn_allen_cahn.py`).
SUITE_SETTING: dict[str, tuple[str, ...]] = {
    "burgers": ("lm_hard", "lm_hard_rad"),
    "allen_cahn": ("lm_windows",),
}


# -- one method on one problem (in a child process) ------------------------------------------
def run_method(name: str, method: str, budget: float) -> dict[str, Any]:
    """Train ``method`` on problem ``name`` for ``budget`` seconds; its error trace."""
    spent = [0.0]
    if method in LM_METHODS:
        problem, step, view = _pinn_lm.lm_stepper(name, method, budget, spent)
        model = view()
    else:
        problem = pinn_suite.problem(name)
        model = problem.network()
        step = _first_order_step(problem, model, method, budget, spent)

        def view() -> torch.nn.Module:
            return model

    trace: list[tuple[float, float]] = [(0.0, problem.relative_l2(view()))]
    times: list[float] = []
    stop = ""
    while spent[0] < budget:
        t0 = time.perf_counter()
        try:
            done = step()
        except RuntimeError as exc:  # a singular update or NaN in a first-order method
            stop = f"error: {exc}"[:200]
            break
        dt = time.perf_counter() - t0
        spent[0] += dt
        times.append(dt)
        err = problem.relative_l2(view())
        trace.append((spent[0], err))
        if not math.isfinite(err):
            stop = "non-finite error"
            break
        if done:
            stop = _pinn_lm.FINISHED.get(method, "LM terminated (damping at its ceiling)")
            break
    x, y = problem.batch(torch.Generator().manual_seed(0))
    rms = float("nan")
    if math.isfinite(trace[-1][1]):
        with torch.no_grad():
            rms = float(_mean_square(problem, view(), x, y).sqrt())
    return {
        "trace": thin(trace),
        "steps": len(times),
        "step_median_s": statistics.median(times) if times else float("nan"),
        # A marched solution's P is that of one window's network.
        "params": getattr(model, "window_params", 0) or sum(p.numel() for p in model.parameters()),
        "rows": int(x.shape[0]),
        "residual_rms": rms,
        "field_error": problem.field_error(view()),
        "stop": stop,
    }


def _mean_square(
    problem: pinn_suite.Problem, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The mean squared residual of ``model`` at the points ``x`` (targets ``y``)."""
    params = dict(model.named_parameters())
    return problem.residual.rows(model, params, x, y).pow(2).mean()


def _first_order_step(
    problem: pinn_suite.Problem,
    model: torch.nn.Module,
    method: str,
    budget: float,
    spent: list[float],
) -> Any:
    """One step of a first-order ``method`` on the problem's fixed points (Adam: 10
    updates; L-BFGS: one call; Adam then L-BFGS: L-BFGS after half the budget)."""
    x, y = problem.batch(torch.Generator().manual_seed(0))

    def loss() -> torch.Tensor:
        return _mean_square(problem, model, x, y)

    if method in ("adam", "adam_lbfgs"):
        first = first_order.adam(model, loss, ADAM_LR, updates=10)
    else:
        first = first_order.lbfgs(model, loss)
    second = first_order.lbfgs(model, loss) if method == "adam_lbfgs" else None

    def fo_step() -> bool:
        (second if second is not None and spent[0] >= budget / 2 else first)()
        return False

    return fo_step


def thin(trace: list[tuple[float, float]], keep: int = 100) -> list[tuple[float, float]]:
    """At most about ``keep`` points of ``trace``, evenly spaced in time, the first and
    the last kept (a 300-s LM run takes thousands of steps)."""
    if len(trace) <= keep:
        return trace
    gap = trace[-1][0] / keep
    out, mark = [], -1.0
    for when, err in trace:
        if when >= mark:
            out.append((when, err))
            mark = when + gap
    if out[-1] != trace[-1]:
        out.append(trace[-1])
    return out


def child(name: str, method: str, budget: float) -> dict[str, Any]:
    """Inside a method's process: ``run_method`` with two threads."""
    setup_threads()
    return run_method(name, method, budget)


# -- the parent --------------------------------------------------------------------------------
def main(
    budget: float = 60.0,
    problems: tuple[str, ...] = tuple(pinn_suite.PROBLEMS),
    methods: tuple[str, ...] = METHODS,
    update: bool = False,
    quick: bool = False,
) -> dict[str, Any]:
    """``methods`` on ``problems``, each in its own process; writes the JSON (``update``:
    into the last results, replacing only the runs made now; ``quick``: a development
    run, written apart so that it never replaces the recorded figures)."""
    name_json = "pinn_suite-quick" if quick else "pinn_suite"
    setup_threads()
    results: dict[str, Any] = {
        "machine": _machine.describe(),
        "budget_s": budget,
        "adam_lr": ADAM_LR,
        "problems": {},
    }
    unknown = sorted(set(methods) - set(METHODS + EXTRA_METHODS))
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; the known ones are {METHODS + EXTRA_METHODS}")
    if update:
        results = json.loads((RESULTS_DIR / f"{name_json}.json").read_text())
        own_budget = set(methods) <= set(EXTRA_METHODS) or set(problems) <= set(pinn_suite.NAMED)
        if results["budget_s"] != budget and not own_budget:
            raise SystemExit(
                f"an update with a budget of {budget} s into results of "
                f"{results['budget_s']} s: the runs would not compare. HINT: pass the budget "
                f"{results['budget_s']:g}, or name switches only (each run keeps its budget)"
            )
    for name in problems:
        pinn_suite.problem(name)  # unknown names fail here, before any run
    for name in problems:
        problem = pinn_suite.problem(name)
        entry: dict[str, Any] = results["problems"].get(name) or {
            "published": problem.published,
            "load_before": _machine.load_average(),
            "runs": {},
        }
        for method in methods:
            out, error = _child.call(
                "bench_pinn_suite", "child", [name, method, budget], timeout=budget * 4 + 180
            )
            entry["runs"][method] = out if out is not None else {"failed": error}
            entry["runs"][method]["budget_s"] = budget
            if update:
                entry["runs"][method]["rerun_load"] = _machine.load_average()
            shown = f"{out['trace'][-1][1]:.3g} ({out['steps']} steps)" if out else error
            print(f"{name:13s} {method:12s} {shown}", flush=True)
        entry.setdefault("load_after", _machine.load_average())
        results["problems"][name] = entry
    if update:
        print(f"wrote {write_json(name_json, results)}")
    return results


def _final(run: dict[str, Any] | None) -> float:
    """The error a run ended with (inf for a failed or non-finite run)."""
    if not run or "trace" not in run:
        return math.inf
    value = float(run["trace"][-1][1])
    return value if math.isfinite(value) else math.inf


def _error_at(trace: list[list[float]], t: float) -> float:
    """The error a run had reached by time ``t`` (its last record not after ``t``)."""
    return [float(e) for when, e in trace if when <= t or when == trace[0][0]][-1]


def _best(runs: dict[str, Any], methods: tuple[str, ...]) -> tuple[str, float]:
    """The method of ``methods`` that ended with the smallest error, and that error."""
    name = min(methods, key=lambda m: _final(runs.get(m)))
    return name, _final(runs.get(name))


def _measured_at(run: dict[str, Any] | None) -> str:
    """ " (measured at <commit>)" for a run recorded apart from the rest of its results (a
    later rerun of one method, merged into the record), "" otherwise."""
    source = (run or {}).get("source", "")
    return f" (measured at {source})" if source else ""


def _published(entry: dict[str, Any]) -> str:
    return "; ".join(f"{e:.2g} ({what}; {src})" for what, e, src in entry["published"])


def rows(results: dict[str, Any]) -> list[Row]:
    """Per problem: LM's error (its defaults, or the problem's `SUITE_SETTING` where it ran
    and did better) against the problem's target, beside the
    published figures and the best switchable setting; LM / the best first-order method
    against 1/100 where first-order methods ran; for a PINN past P × P, LM / Adam."""
    rows = []
    for name, entry in results["problems"].items():
        runs = entry["runs"]
        lm_name, lm = _best(runs, ("lm", "lm_resample", *SUITE_SETTING.get(name, ())))
        if name in pinn_suite.LARGE:
            params = (runs.get("lm") or {}).get("params", 0)
            what = f"pinn_suite: {name} (P = {params:,}), LM / Adam at equal time"
            rows.append(_ratio(what, lm, "adam", _final(runs.get("adam")), 1.0))
            continue
        notes = [lm_name + _measured_at(runs.get(lm_name))]
        switch, switched = _best(runs, EXTRA_METHODS)
        if math.isfinite(switched):
            notes.append(f"best switch {switch} {switched:.2g}")
        if entry["published"]:
            notes.append(f"published {_published(entry)}")
        budget = (runs.get(lm_name) or {}).get("budget_s", results["budget_s"])
        at = f" at {budget:.0f} s" if budget != results["budget_s"] else ""
        rows.append(
            row(
                f"pinn_suite: {name}, LM error{at}",
                lm,
                LM_TARGET.get(name, 1e-4),
                unit="",
                detail="; ".join(notes),
            )
        )
        if not any(m in runs for m in FIRST_ORDER):
            continue
        best_name, best = _best(runs, FIRST_ORDER)
        ratio = _ratio(f"pinn_suite: {name}, LM / best first-order", lm, best_name, best, 0.01)
        if lm_name not in ("lm", "lm_resample"):
            # Not like for like: the first-order methods ran on the plain problem.
            detail = f"{ratio.detail}; LM as {lm_name}, the first-order methods without it"
            ratio = dataclasses.replace(ratio, detail=detail)
        rows.append(ratio)
    return rows


def _ratio(what: str, lm: float, other_name: str, other: float, target: float) -> Row:
    """The row of LM's error over another method's, against ``target``."""
    ratio = lm / other if other > 0 else float("nan")
    return row(what, ratio, target, detail=f"{lm:.3g} vs {other_name} {other:.3g}")


def section(results: dict[str, Any]) -> str:
    """RESULTS.md's section: one line per problem, the methods' errors, published figures."""
    m = results["machine"]
    lines = [
        f"{results['budget_s']:.0f} s per method and problem, float64, {m['cpu']}; Adam at "
        f"{results['adam_lr']:g}. Relative L2 error against the reference (heat_inverse: the "
        "coefficient's relative error); load average before → after each problem.",
        "",
        "| problem | P | rows | LM | LM, a quarter of the points redrawn per step | Adam | L-BFGS | "
        "Adam → L-BFGS | published | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in results["problems"].items():
        runs = entry["runs"]
        lm = runs.get("lm") or {}
        cells = []
        for method in METHODS:
            r = runs.get(method)
            if r is None:
                cells.append("—")
                continue
            cells.append(f"{_final(r):.2g} ({r.get('steps', 0)})" if "trace" in r else "failed")
        published = _published(entry)
        lines.append(
            f"| {name} | {lm.get('params', '')} | {lm.get('rows', '')} | "
            + " | ".join(cells)
            + f" | {published or '—'} | {entry['load_before']:.1f} → {entry['load_after']:.1f} |"
        )
    lines += [
        "",
        "(steps in parentheses; a first-order step is 10 Adam updates or one L-BFGS call of ≤ 20 iterations)",
    ]
    extra = [
        (name, method, entry["runs"][method])
        for name, entry in results["problems"].items()
        for method in EXTRA_METHODS
        if "trace" in entry["runs"].get(method, {})
    ]
    if extra:
        lines += [
            "",
            "LM's switchable settings (`_pinn_lm.py`), each beside `lm` on the same problem at "
            "the same time (read from `lm`'s trace where the setting ran for less):",
            "",
        ]
        lines += [
            "| problem | setting | budget | error (steps) | lm at that time | load |",
            "|---|---|---|---|---|---|",
        ]
        for name, method, r in extra:
            lm = results["problems"][name]["runs"].get("lm") or {}
            budget = r.get("budget_s", results["budget_s"])
            lm_then = _error_at(lm["trace"], budget) if "trace" in lm else math.inf
            load = f"{r['rerun_load']:.1f}" if "rerun_load" in r else "—"
            lines.append(
                f"| {name} | {method} | {budget:.0f} s | {_final(r):.2g} ({r['steps']}) | "
                f"{lm_then:.2g} | {load} |"
            )
    return "\n".join(lines)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    if o.quick:
        return main(budget=o.budget or 5.0, problems=("heat", "poisson"), quick=True)
    return main() if o.budget is None else main(budget=o.budget)
