"""The 2-D Poisson problem of the PINN tests, and one rank of their two-process run.

−Δu = 2π² sin(πx) sin(πy) on the unit square, u = 0 on its boundary; the exact solution
is u = sin(πx) sin(πy). A small tanh network is fitted to the PDE residual at interior
grid points and to u at boundary points (``PointResidual``, two groups).

``python pinn_problems.py RANK WORLD STORE OUT`` joins a gloo group through a file store
(1 torch thread), takes :data:`STEPS` steps of each configuration in :data:`CONFIGS` on its
share of the global batch with ``LMA(process_group="default")`` and, on rank 0, writes the
iterates to ``OUT``; :func:`run_config` with ``group=False`` is the one-process reference.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from file_store_group import join_file_store_group
from torch import nn

from marquardt.jacobian import PointResidual, ResidualGroup
from marquardt.solver import LMA

STEPS = 2
CONFIGS: dict[str, dict[str, Any]] = {
    "accumulate": {"strategy": "accumulate"},
    "explicit": {"strategy": "explicit"},
    "subsets": {"params_per_step": 40, "seed": 3},
}


def source(x: torch.Tensor) -> torch.Tensor:
    """f = 2π² sin(πx) sin(πy) at the points ``x`` (n × 2)."""
    return 2 * math.pi**2 * torch.sin(math.pi * x[:, 0]) * torch.sin(math.pi * x[:, 1])


def exact(x: torch.Tensor) -> torch.Tensor:
    """u = sin(πx) sin(πy)."""
    return torch.sin(math.pi * x[:, 0]) * torch.sin(math.pi * x[:, 1])


def pde(u: Any, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """−Δu − f at one interior point."""
    return -u.laplacian(x) - f


def boundary(u: Any, x: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    """u at one boundary point (u = 0 there)."""
    return u(x)


def residual() -> PointResidual:
    return PointResidual(ResidualGroup("pde", pde), ResidualGroup("boundary", boundary))


def network(hidden: int = 12) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
    ).double()


def points(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n × n`` interior grid points and ``4n + 4`` boundary points."""
    g = torch.linspace(0, 1, n + 2, dtype=torch.float64)[1:-1]
    inner = torch.cartesian_prod(g, g)
    t = torch.linspace(0, 1, n + 1, dtype=torch.float64)
    zero, one = torch.zeros_like(t), torch.ones_like(t)
    edge = torch.cat([torch.stack(p, 1) for p in ((t, zero), (t, one), (zero, t), (one, t))])
    return inner, edge


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    inner, edge = points(n)
    return residual().batch(pde=(inner, source(inner)), boundary=edge)


def relative_error(model: nn.Module, n: int = 41) -> float:
    """‖u_θ − u‖ / ‖u‖ on an n × n grid of the closed square."""
    g = torch.linspace(0, 1, n, dtype=torch.float64)
    x = torch.cartesian_prod(g, g)
    with torch.no_grad():
        u = model(x)[:, 0]
    return float((u - exact(x)).norm() / exact(x).norm())


def run_config(name: str, *, group: bool) -> dict[str, Any]:
    """STEPS steps of configuration ``name`` on the 6 × 6 problem: θ and λ per step."""
    x, y = batch(6)
    if group:
        half = int(x.shape[0]) // 2 + 3  # uneven shares; rank 1's holds both groups
        lo, hi = (0, half) if dist.get_rank() == 0 else (half, int(x.shape[0]))
        x, y = x[lo:hi], y[lo:hi]
    lma = LMA(
        network(6),
        ["cpu"],
        residual(),
        process_group="default" if group else None,
        **CONFIGS[name],
    )
    out: dict[str, Any] = {"theta": [], "damping": [], "loss": []}
    for _ in range(STEPS):
        loss, _ = lma.step(x, y)
        out["theta"].append(torch.nn.utils.parameters_to_vector(lma.model.parameters()).clone())
        out["damping"].append(lma.damping)
        out["loss"].append(loss)
    return out


def main() -> None:
    rank, out = join_file_store_group(timeout_s=30)
    results = {name: run_config(name, group=True) for name in CONFIGS}
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
