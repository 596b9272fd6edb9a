"""Jacobian benchmark on the sinc problem: marquardt.jacobian against torch-levenberg-marquardt.

Problem: ``y = sinc(10 x)`` on ``x ∈ [-1, 1]``, a 1-256-1 tanh MLP (``P = 769``),
``N = 10000`` samples, float32, ``torch.set_num_threads(2)``. Timed in one run, medians
over repeats:

* peer ``J``: ``LevenbergMarquardtModule._compute_jacobian`` (per-sample ``vmap(jacrev)``),
  called as its training step calls it;
* peer ``J, JᵀJ, Jᵀr``: the same followed by the products its step forms;
* ours ``explicit``: ``JacobianEngine.jacobian`` (the whole ``J`` and ``r``);
* ours ``accumulate``: ``JacobianEngine.accumulate`` (``JᵀJ``, ``Jᵀr``, ``rᵀr``);
* ours ``vmap`` mode, for reference.

Targets: ours ≤ 1.0× the peer. Memory: the peak resident-memory growth of
``accumulate`` with a fixed slice for ``N = 10k`` and ``N = 100k`` (it should not grow
with ``N``). Run ``python benchmarks/run_all.py jacobian``; ``main()`` returns the
results.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import _child
import _common as c
import _machine
import torch
from _registry import Options
from _rows import row

from marquardt.jacobian import JacobianEngine, Replicas
from marquardt.testing.problems import sinc

N = 10_000
REPEATS = 9
WARMUP = 2


def median_seconds(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(repeats: int = REPEATS, *, quick: bool = False) -> dict[str, Any]:
    """``quick``: a development run, written to ``jacobian-quick.json`` apart from the figures."""
    torch.set_num_threads(2)
    x, y = sinc(N)
    results: dict[str, Any] = {
        "problem": "sinc, 1-256-1 tanh MLP, P=769, N=10000, float32, 2 threads",
        "repeats": repeats,
        "torch": torch.__version__,
    }

    # The peer, called as its training step calls it.
    import torch_levenberg_marquardt as tlm

    peer = tlm.training.LevenbergMarquardtModule(copy.deepcopy(c.sinc_model(256)))

    def peer_jacobian() -> object:
        return peer._compute_jacobian(x, y, None)

    def peer_products() -> object:
        jac, res, _ = peer._compute_jacobian(x, y, None)
        return jac.t().matmul(jac), jac.t().matmul(res)

    # Ours.
    model = c.sinc_model(256)
    replicas = Replicas(model, [torch.device("cpu")])
    engine = JacobianEngine(replicas, lambda a, b: a - b)
    vmap_engine = JacobianEngine(replicas, lambda a, b: a - b, mode="vmap")

    # Same J from both (checked once, outside the timing).
    j_peer = peer._compute_jacobian(x, y, None)[0]
    j_ours = engine.jacobian(x, y)[0]
    results["max_abs_diff_J_vs_peer"] = float((j_peer - j_ours).abs().max())

    times = {
        "peer_jacobian": median_seconds(peer_jacobian, repeats),
        "peer_jacobian_and_products": median_seconds(peer_products, repeats),
        "ours_explicit": median_seconds(lambda: engine.jacobian(x, y), repeats),
    }
    results["explicit_plan"] = engine.last_plan.reason if engine.last_plan else ""
    times["ours_accumulate"] = median_seconds(lambda: engine.accumulate(x, y), repeats)
    results["accumulate_plan"] = engine.last_plan.reason if engine.last_plan else ""
    results["accumulate_timings"] = dict(engine.accumulate(x, y).timings)
    times["ours_vmap_explicit"] = median_seconds(
        lambda: vmap_engine.jacobian(x, y), max(3, repeats // 3)
    )
    results["seconds"] = times
    results["ratios"] = {
        "explicit_vs_peer_jacobian": times["ours_explicit"] / times["peer_jacobian"],
        "accumulate_vs_peer_jacobian": times["ours_accumulate"] / times["peer_jacobian"],
        "accumulate_vs_peer_jacobian_and_products": times["ours_accumulate"]
        / times["peer_jacobian_and_products"],
        "vmap_mode_vs_peer_jacobian": times["ours_vmap_explicit"] / times["peer_jacobian"],
    }
    results["target_ratio"] = 1.0

    # Accumulate memory with a fixed slice: N = 10k and 100k, each in a fresh process so
    # the peak is not hidden by memory an earlier measurement left to the allocator.
    memory: dict[str, float | None] = {}
    for n in (10_000, 100_000):
        grown, error = _child.call("bench_jacobian", "memory_child", [n], timeout=600)
        if error:
            raise RuntimeError(f"the memory child at N={n} failed: {error}")
        memory[f"N={n}"] = grown
    results["accumulate_peak_rss_growth_mib_slice_5000"] = memory
    results["explicit_J_mib"] = N * replicas.num_params * 4 / 2**20

    return results


def echo(results: dict[str, Any]) -> None:
    """What a run prints beside its rows."""
    s = results["seconds"]
    r = results["ratios"]
    t = results["target_ratio"]
    print(results["problem"])
    print(f"  peer _compute_jacobian (vmap(jacrev))      {s['peer_jacobian'] * 1e3:8.1f} ms")
    print(
        f"  peer J + JᵀJ + Jᵀr                          {s['peer_jacobian_and_products'] * 1e3:8.1f} ms"
    )
    print(
        f"  ours explicit (whole J)                     {s['ours_explicit'] * 1e3:8.1f} ms   "
        f"ratio {r['explicit_vs_peer_jacobian']:.3f}× (target ≤ {t:.1f}×)"
    )
    print(
        f"  ours accumulate (JᵀJ, Jᵀr)                  {s['ours_accumulate'] * 1e3:8.1f} ms   "
        f"ratio {r['accumulate_vs_peer_jacobian']:.3f}× of peer J (target ≤ {t:.1f}×), "
        f"{r['accumulate_vs_peer_jacobian_and_products']:.3f}× of peer J+products"
    )
    print(
        f"  ours vmap mode (reference)                  {s['ours_vmap_explicit'] * 1e3:8.1f} ms   "
        f"ratio {r['vmap_mode_vs_peer_jacobian']:.3f}×"
    )
    print(f"  max |J_ours - J_peer| = {results['max_abs_diff_J_vs_peer']:.2e}")
    mem = results["accumulate_peak_rss_growth_mib_slice_5000"]
    print(
        "  accumulate peak RSS growth, slice 5000: "
        + ", ".join(f"{k}: {v:.1f} MiB" if v is not None else f"{k}: n/a" for k, v in mem.items())
        + f" (explicit J alone: {results['explicit_J_mib']:.1f} MiB)"
    )
    print(f"  plan: {results['accumulate_plan']}")


def memory_child(n: int) -> float | None:
    """Peak RSS growth of one accumulate over ``n`` samples (slice 5000), fresh process."""
    torch.set_num_threads(2)
    x, y = sinc(n)
    engine = JacobianEngine(Replicas(c.sinc_model(256), [torch.device("cpu")]), lambda a, b: a - b)
    engine.rows_per_sample(x, y)  # imports and first-call set-up outside the measurement
    return _machine.peak_growth_mib(lambda: engine.accumulate(x, y, slice_size=5000))


def rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The ratios with their targets, for the aggregate table."""
    s, ratios, target = r["seconds"], r["ratios"], r.get("target_ratio", 1.0)
    mem = r.get("accumulate_peak_rss_growth_mib_slice_5000", {})
    mem_text = ", ".join(f"{k}: {v:.0f} MiB" for k, v in mem.items() if v is not None)
    return [
        row(
            "jacobian: explicit J / peer J (N=10000)",
            ratios["explicit_vs_peer_jacobian"],
            target,
            detail=f"ours {s['ours_explicit'] * 1e3:.0f} ms, peer "
            f"{s['peer_jacobian'] * 1e3:.0f} ms",
        ),
        row(
            "jacobian: accumulate / peer J",
            ratios["accumulate_vs_peer_jacobian"],
            target,
            detail=f"ours {s['ours_accumulate'] * 1e3:.0f} ms (J, JᵀJ, Jᵀr)",
        ),
        row(
            "jacobian: accumulate / peer J+JᵀJ+Jᵀr",
            ratios["accumulate_vs_peer_jacobian_and_products"],
            None,
            detail=f"peer {s['peer_jacobian_and_products'] * 1e3:.0f} ms; accumulate peak "
            f"growth {mem_text}",
        ),
    ]


def section(j: dict[str, Any]) -> str:
    s = j["seconds"]
    lines = [f"{j['problem']}, {j['repeats']} repeats, medians."]
    for k, v in s.items():
        lines.append(f"- {k}: {v * 1e3:.0f} ms")
    lines.append(f"- plan: {j.get('accumulate_plan', '')}")
    return "\n".join(lines)


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it."""
    return main(3 if o.quick else REPEATS, quick=o.quick)
