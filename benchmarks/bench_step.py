"""LM step time on sinc: marquardt.solver.LMA against torch-levenberg-marquardt, and the floor.

Problem: batches of 10000 points of ``y = sinc(10 x)`` (from the seed's 100000, shuffled),
a 1-256-1 tanh MLP (P = 769), float32, ``torch.set_num_threads(2)``. Both optimizers start
from the same parameters, see the same batches, and use the same damping defaults
(λ₀ = 1e-3, ×10 on rejection, ×0.1 on acceptance, λ ∈ [1e-10, 1e10], D = I, at most 10
attempts). The peer is driven as its own ``fit`` loop drives it: one
``LevenbergMarquardtModule.training_step(x, y)`` per batch, with its Cholesky solver.
The steps of both are interleaved so that a change of machine load hits both alike.

The floor is the work no LM step on this problem can avoid: the Gram product ``JᵀJ``
(N·P² multiply-adds, half with a symmetric rank-k update) by the fastest kernel found here
(torch ``mm``; NumPy ``A.T @ A``, which calls its BLAS's ``syrk``; SciPy ``ssyrk``;
the ``ssyrk`` of the MKL inside torch, where it is exported; ``_floor.py``) plus one
float64 Cholesky factorisation and solve of the P × P system, measured in the same run.

Targets: ours ≤ 0.67× the peer's median step; ours ≤ 1.5× the floor.
``python benchmarks/run_all.py step``; ``main()`` returns the results and writes ``results/step.png``.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import _common as c
import _machine
import torch
from _floor import floor_seconds
from _registry import Options
from _rows import row

from marquardt.testing.problems import sinc

STEPS = 15
WARMUP = 2
HIDDEN = 256
TARGET_PEER = 0.67
TARGET_FLOOR = 1.5


def main(
    steps: int = STEPS, hidden: int = HIDDEN, batch: int = c.BATCH, *, quick: bool = False
) -> dict[str, Any]:
    """``quick``: a development run, written to ``step-quick.*`` apart from the figures."""
    c.setup_threads()
    from marquardt.jacobian import JacobianEngine, Replicas
    from marquardt.solver import LMA

    tlm = c.import_peer()
    x_all, y_all = sinc()
    batches = c.shuffled_batches(x_all, y_all, batch)
    pairs = [next(batches) for _ in range(WARMUP + steps)]

    ours = LMA(c.sinc_model(hidden), [torch.device("cpu")], lambda a, b: a - b)
    peer = tlm.training.LevenbergMarquardtModule(
        copy.deepcopy(c.sinc_model(hidden)), solve_method="cholesky"
    )
    load_before = _machine.load_average()
    ours_s: list[float] = []
    peer_s: list[float] = []
    ours_attempts: list[int] = []
    peer_attempts: list[int] = []
    parts: dict[str, list[float]] = {
        k: [] for k in ("jacobian", "transfer", "assembly", "solve", "trial")
    }
    for i, (x, y) in enumerate(pairs):
        t0 = time.perf_counter()
        ours.step(x, y)
        t1 = time.perf_counter()
        _out, _loss, _stop, logs = peer.training_step(x, y)
        t2 = time.perf_counter()
        if i < WARMUP:
            continue
        ours_s.append(t1 - t0)
        peer_s.append(t2 - t1)
        report = ours.report
        assert report is not None
        ours_attempts.append(report.attempts)
        peer_attempts.append(int(logs["attempts"]))
        for k in parts:
            parts[k].append(float(getattr(report, f"seconds_{k}")))

    # Parts of the peer's step, for orientation: its Jacobian, and JᵀJ as it forms it.
    x, y = pairs[-1]
    peer_jac = c.median(
        c.time_calls(lambda: peer._compute_jacobian(x, y, None), max(3, steps // 3))
    )
    engine = JacobianEngine(
        Replicas(c.sinc_model(hidden), [torch.device("cpu")]), lambda a, b: a - b
    )
    jac, _res = engine.jacobian(x, y)
    jac = jac.contiguous()
    floor = floor_seconds(jac, max(5, steps // 2))
    peer_gemm = floor["gram_seconds"]["torch mm (full GEMM)"]

    ours_med = c.median(ours_s)
    peer_med = c.median(peer_s)
    report = ours.report
    assert report is not None
    results: dict[str, Any] = {
        "problem": f"sinc(10x), 1-{hidden}-1 tanh MLP (P={jac.shape[1]}), batch {batch}, "
        f"float32, {c.THREADS} threads",
        "steps": steps,
        "ours_config": f"LMA defaults (Nielsen damping, Marquardt scaling, strategy auto → "
        f"{report.strategy}, backend auto → {report.backend}), slice_size=None",
        "peer_config": "LevenbergMarquardtModule(solve_method='cholesky'), defaults otherwise",
        "seconds": {
            "ours_step_median": ours_med,
            "peer_step_median": peer_med,
            "ours_steps": ours_s,
            "peer_steps": peer_s,
            "ours_parts_median": {k: c.median(v) for k, v in parts.items()},
            "peer_compute_jacobian_median": peer_jac,
            "peer_jtj_full_gemm_median": peer_gemm,
        },
        "attempts_median": {"ours": c.median(ours_attempts), "peer": c.median(peer_attempts)},
        "floor": floor,
        "ratios": {
            "ours_vs_peer": ours_med / peer_med,
            "ours_vs_floor": ours_med / floor["floor_seconds"],
        },
        "targets": {"ours_vs_peer": TARGET_PEER, "ours_vs_floor": TARGET_FLOOR},
        "load_average": {"before": load_before, "after": _machine.load_average()},
    }
    _plot(results, f"step{c.suffix(quick)}.png")
    return results


@c.plot
def _plot(plt: Any, results: dict[str, Any]) -> Any:
    s = results["seconds"]
    parts = s["ours_parts_median"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    left = 0.0
    colors = ["#4c72b0", "#8172b2", "#55a868", "#c44e52", "#dd8452"]
    for (name, value), color in zip(parts.items(), colors, strict=False):
        ax.barh("ours (median parts)", value * 1e3, left=left, color=color, label=name)
        left += value * 1e3
    ax.barh("ours", s["ours_step_median"] * 1e3, color="#4c72b0")
    ax.barh("torch-levenberg-marquardt", s["peer_step_median"] * 1e3, color="#937860")
    f = results["floor"]
    ax.barh("floor: JᵀJ + Cholesky", f["floor_seconds"] * 1e3, color="#999999")
    ax.set_xlabel("milliseconds per LM step (median)")
    ax.set_title(results["problem"], fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The ratios with their targets, for the aggregate table."""
    s = results["seconds"]
    f = results["floor"]
    attempts = results["attempts_median"]
    return [
        row(
            "step: ours / peer (1-256-1, N=10000)",
            results["ratios"]["ours_vs_peer"],
            TARGET_PEER,
            detail=f"ours {s['ours_step_median'] * 1e3:.0f} ms, peer "
            f"{s['peer_step_median'] * 1e3:.0f} ms (median attempts {attempts['ours']:.0f} / "
            f"{attempts['peer']:.0f})",
        ),
        row(
            "step: ours / floor (JᵀJ + Cholesky)",
            results["ratios"]["ours_vs_floor"],
            TARGET_FLOOR,
            detail=f"floor {f['floor_seconds'] * 1e3:.0f} ms = {f['gram_best_kernel']} "
            f"{f['gram_seconds'][f['gram_best_kernel']] * 1e3:.0f} ms + float64 Cholesky "
            f"{f['cholesky_float64_seconds'] * 1e3:.1f} ms",
        ),
    ]


def echo(results: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    print(results["problem"])
    s = results["seconds"]
    parts = s["ours_parts_median"]
    print("  ours, median parts: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in parts.items()))
    print(
        f"  peer parts: _compute_jacobian {s['peer_compute_jacobian_median'] * 1e3:.0f} ms, "
        f"JᵀJ full GEMM {s['peer_jtj_full_gemm_median'] * 1e3:.0f} ms"
    )
    print(
        "  Gram kernels: "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in results["floor"]["gram_seconds"].items())
    )


def section(st: dict[str, Any]) -> str:
    s = st["seconds"]
    parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in s["ours_parts_median"].items())
    gram = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in st["floor"]["gram_seconds"].items())
    return (
        f"{st['problem']}; {st['steps']} steps each, interleaved, medians.\n\n"
        f"- ours: {s['ours_step_median'] * 1e3:.0f} ms per step ({st['ours_config']}); "
        f"median parts from `lma.report`: {parts}; median attempts "
        f"{st['attempts_median']['ours']:g}\n"
        f"- peer: {s['peer_step_median'] * 1e3:.0f} ms per step ({st['peer_config']}); its "
        f"`_compute_jacobian` {s['peer_compute_jacobian_median'] * 1e3:.0f} ms, JᵀJ as a full "
        f"GEMM {s['peer_jtj_full_gemm_median'] * 1e3:.0f} ms; median attempts "
        f"{st['attempts_median']['peer']:g}\n"
        f"- floor: {st['floor']['floor_seconds'] * 1e3:.0f} ms = fastest JᵀJ kernel "
        f"({gram}) + float64 P×P Cholesky solve "
        f"{st['floor']['cholesky_float64_seconds'] * 1e3:.1f} ms"
    )


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(4 if o.quick else STEPS, quick=o.quick)
