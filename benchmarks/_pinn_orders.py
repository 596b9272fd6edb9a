"""The Jacobian orders of the PINN residual, measured: which nesting of ``torch.func``
transforms forms J and JᵀJ of ``bench_pinn.py``'s Poisson residual fastest.

Recorded in ``results/pinn_orders.json``, which ``bench_pinn.py``'s section shows. In a
process of its own: ``python benchmarks/_child.py _pinn_orders main '[false, "cpu"]'``
(``true`` for the quick sizes).
"""

from __future__ import annotations

import time
from typing import Any

import _machine
import torch
from _common import setup_threads, suffix, write_json
from bench_pinn import collocation, network, sizes

from marquardt.testing.problems import poisson_boundary as boundary
from marquardt.testing.problems import poisson_source as source

HESSIANS = {
    "jacfwd(jacrev) (torch.func.hessian)": lambda u: torch.func.jacfwd(torch.func.jacrev(u)),
    "jacrev(jacrev)": lambda u: torch.func.jacrev(torch.func.jacrev(u)),
    "jacrev(jacfwd)": lambda u: torch.func.jacrev(torch.func.jacfwd(u)),
    "jacfwd(jacfwd)": lambda u: torch.func.jacfwd(torch.func.jacfwd(u)),
}


def measure_orders(quick: bool, device: torch.device) -> list[dict[str, Any]]:
    """Seconds of one J (explicit) and of one JᵀJ (accumulate) of the Poisson residual, per
    order over θ (``vmap``: reverse, ``jacfwd``: forward) and per order of the input
    Hessian inside the residual; the J of every combination is checked against the first."""
    from marquardt.jacobian import JacobianEngine, PointResidual, Replicas, ResidualGroup

    hidden, n = sizes(quick)
    inner, edge = collocation(n)
    out: list[dict[str, Any]] = []
    reference = None
    for name, hess in HESSIANS.items():

        def laplacian_rows(
            u: Any, x: torch.Tensor, f: torch.Tensor, hess: Any = hess
        ) -> torch.Tensor:
            return -hess(u)(x).trace() - f

        residual = PointResidual(
            ResidualGroup("pde", laplacian_rows), ResidualGroup("boundary", boundary)
        )
        x, y = residual.batch(pde=(inner, source(inner)), boundary=edge)
        for mode in ("vmap", "jacfwd"):
            engine = JacobianEngine(
                Replicas(network(hidden, device), [device]), residual, mode=mode
            )
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                jac, _ = engine.jacobian(x, y)
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            engine.accumulate(x, y)
            acc = time.perf_counter() - t0
            if reference is None:
                reference = jac
            diff = float((jac - reference).abs().max())
            out.append(
                {
                    "hessian": name,
                    "order_over_theta": mode,
                    "explicit_s": min(times),
                    "accumulate_s": acc,
                    "max_diff": diff,
                }
            )
            print(
                f"{name:38s} {mode:7s} J {min(times) * 1e3:8.1f} ms  JᵀJ {acc * 1e3:8.1f} ms"
                f"  |ΔJ| {diff:.1e}",
                flush=True,
            )
            engine.close()
    return out


def main(quick: bool, device: str) -> str:
    """Measure on ``device`` and write ``results/pinn_orders.json``; its path."""
    setup_threads()
    orders: dict[str, Any] = {"machine": _machine.describe(), "quick": quick}
    orders["orders"] = measure_orders(quick, torch.device(device))
    return str(write_json("pinn_orders" + suffix(quick, device), orders))
