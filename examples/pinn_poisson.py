"""Solve the 2-D Poisson problem with a physics-informed network trained by LM.

−Δu = 2π² sin(πx) sin(πy) on the unit square, u = 0 on its boundary (exact solution
u = sin(πx) sin(πy)). A 2-H-H-1 tanh network (float64) is fitted to the PDE residual at
interior collocation points and to u at boundary points, written as a
``marquardt.jacobian.PointResidual`` with two groups; ``LMA`` differentiates through the
Laplacian by ``torch.func``, slice by slice, on every model device.

    python examples/pinn_poisson.py                    # 2-32-32-1, a 36 × 36 grid
    python examples/pinn_poisson.py --resample         # new interior points every step
    python examples/pinn_poisson.py --hidden 16 --grid 20 --steps 150 --plot field.png

It prints the loss and the relative L2 error on a 41 × 41 test grid every 10 steps, and
with ``--plot`` saves the error field u_θ − u. The tutorial (docs/tutorial/pinn.md) runs
a smaller version of the same problem step by step.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

from marquardt.devices import get_available_gpus
from marquardt.jacobian import PointResidual, ResidualGroup
from marquardt.solver import LMA

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--hidden", type=int, default=32, help="width of the two hidden layers")
parser.add_argument("--grid", type=int, default=36, help="interior points per side")
parser.add_argument("--steps", type=int, default=300, help="LM steps at most")
parser.add_argument("--resample", action="store_true", help="new interior points every step")
parser.add_argument("--target", type=float, default=1e-5, help="stop at this relative error")
parser.add_argument("--plot", default=None, help="save the error field to this PNG")
args = parser.parse_args()

pi = math.pi


def source(x: torch.Tensor) -> torch.Tensor:
    return 2 * pi**2 * torch.sin(pi * x[:, 0]) * torch.sin(pi * x[:, 1])


def exact(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(pi * x[:, 0]) * torch.sin(pi * x[:, 1])


def pde(u, x, f):  # type: ignore[no-untyped-def]
    """−Δu − f at one interior point."""
    return -u.laplacian(x) - f


def boundary(u, x, _g):  # type: ignore[no-untyped-def]
    """u at one boundary point (u = 0 there)."""
    return u(x)


residual = PointResidual(ResidualGroup("pde", pde), ResidualGroup("boundary", boundary))

n = args.grid
grid = torch.linspace(0, 1, n + 2, dtype=torch.float64)[1:-1]
interior = torch.cartesian_prod(grid, grid)
t = torch.linspace(0, 1, n + 1, dtype=torch.float64)
zero, one = torch.zeros_like(t), torch.ones_like(t)
edge = torch.cat([torch.stack(p, 1) for p in ((t, zero), (t, one), (zero, t), (one, t))])

devices = get_available_gpus()
torch.manual_seed(0)
h = args.hidden
model = (
    nn.Sequential(nn.Linear(2, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(), nn.Linear(h, 1))
    .double()
    .to(devices[0])
)
lma = LMA(model, devices, residual, geodesic=0.75, scaling_memory=1.0)

g = torch.linspace(0, 1, 41, dtype=torch.float64)
test = torch.cartesian_prod(g, g).to(devices[0])


def relative_error() -> float:
    with torch.no_grad():
        return float((model(test)[:, 0] - exact(test)).norm() / exact(test).norm())


gen = torch.Generator().manual_seed(1)
x, y = residual.batch(pde=(interior, source(interior)), boundary=edge)
start = time.perf_counter()
for step in range(1, args.steps + 1):
    if args.resample:
        fresh = torch.rand(n * n, 2, generator=gen, dtype=torch.float64)
        x, y = residual.batch(pde=(fresh, source(fresh)), boundary=edge)
    loss, terminated = lma.step(x, y)
    error = relative_error()
    if step % 10 == 0 or terminated or error <= args.target:
        print(
            f"step {step:4d}  loss {loss:.3e}  relative L2 error {error:.3e}  "
            f"{time.perf_counter() - start:6.1f} s",
            flush=True,
        )
    if terminated or error <= args.target:
        break
print(f"final relative L2 error {relative_error():.3e} after {step} steps")

if args.plot:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = torch.linspace(0, 1, 101, dtype=torch.float64)
    xx = torch.cartesian_prod(k, k).to(devices[0])
    with torch.no_grad():
        field = (model(xx)[:, 0] - exact(xx)).reshape(101, 101).cpu()
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    im = ax.imshow(field, origin="lower", extent=(0, 1, 0, 1), cmap="RdBu_r")
    fig.colorbar(im, ax=ax, label="u_θ − u")
    ax.set_xlabel("y")
    ax.set_ylabel("x")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"saved {args.plot}")
