"""Train the 2-D Poisson PINN through the ``Trainer``, on collocation points that move.

−Δu = 2π² sin(πx) sin(πy) on the unit square, u = 0 on its boundary (exact solution
u = sin(πx) sin(πy)). An ``LMA`` on a ``PointResidual`` is the Trainer's optimizer; a
``marquardt.jacobian.Collocation`` behind a ``DataLoader`` gives every epoch's LM step
its points (a ``--refresh`` fraction of them redrawn every ``--every`` epochs, or
residual-weighted with ``--power``); the validation reports the relative L2 error on a
41 × 41 grid (``val_error``, watched by early stopping) and the RMS of the PDE residual
at fixed check points (``val_pde_rms``); ``--budget`` stops the run after that many
seconds (``WallClockBudget``), with a checkpoint.

    python examples/pinn_trainer.py                         # 2-20-20-1, 400 + 100 rows
    python examples/pinn_trainer.py --refresh 1 --every 5   # all points new every 5 epochs
    python examples/pinn_trainer.py --power 1 --epochs 200 --budget 60
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from marquardt.jacobian import Collocation, PointResidual, ResidualGroup
from marquardt.solver import LMA
from marquardt.trainer import EarlyStopping, TrainConfig, Trainer, WallClockBudget

F64 = torch.float64


def source(x: torch.Tensor) -> torch.Tensor:
    return 2 * math.pi**2 * torch.sin(math.pi * x[..., 0]) * torch.sin(math.pi * x[..., 1])


def exact(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(math.pi * x[..., 0]) * torch.sin(math.pi * x[..., 1])


def pde(u: Any, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return -u.laplacian(x) - f


def boundary(u: Any, x: torch.Tensor, _g: torch.Tensor) -> torch.Tensor:
    return u(x)


def interior_points(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.rand(n, 2, generator=gen, dtype=F64)
    return p, source(p)


def edge_points(n: int, gen: torch.Generator) -> torch.Tensor:
    s = torch.rand(n, generator=gen, dtype=F64)
    side = torch.randint(0, 4, (n,), generator=gen)
    fixed = (side % 2).to(F64)
    return torch.where((side < 2)[:, None], torch.stack([s, fixed], 1), torch.stack([fixed, s], 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=20)
    parser.add_argument("--rows", type=int, default=400, help="interior rows per batch")
    parser.add_argument("--epochs", type=int, default=100, help="one LM step per epoch")
    parser.add_argument("--refresh", type=float, default=0.25)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--power", type=float, default=0.0)
    parser.add_argument("--budget", type=float, default=600.0, help="seconds")
    parser.add_argument("--root", default="pinn_runs")
    args = parser.parse_args()

    residual = PointResidual(ResidualGroup("pde", pde), ResidualGroup("boundary", boundary))
    torch.manual_seed(0)
    h = args.hidden
    model = nn.Sequential(
        nn.Linear(2, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(), nn.Linear(h, 1)
    ).double()
    points = Collocation(
        residual,
        {"pde": interior_points, "boundary": edge_points},
        {"pde": args.rows, "boundary": max(4, args.rows // 4)},
        refresh=args.refresh,
        every=args.every,
        power=args.power,
        model=model if args.power > 0 else None,
    )
    grid = torch.linspace(0, 1, 41, dtype=F64)
    test = torch.cartesian_prod(grid, grid)
    inner = torch.cartesian_prod(grid[1:-1], grid[1:-1])
    check_x, check_y = residual.batch(pde=(inner, source(inner)))

    def metrics(batch: Any, model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        xt, ut = batch
        error = (model(xt)[:, 0] - ut).norm() / ut.norm()
        rows = residual.rows(model, dict(model.named_parameters()), check_x, check_y)
        return error, {"error": error, "pde_rms": rows.pow(2).mean().sqrt()}

    lma = LMA(model, [torch.device("cpu")], residual)
    config = TrainConfig(
        max_iter=args.epochs - 1,
        val_every=10,
        print_every=10,
        checkpoint_every=50,
        root_folder=args.root,
        callbacks=[
            EarlyStopping(monitor="val_error", patience=5),
            WallClockBudget(args.budget),
        ],
    )
    trainer = Trainer(model, lma, config, loss_fn=metrics)
    trainer.fit(
        DataLoader(points, batch_size=None),
        DataLoader([(test, exact(test))], batch_size=None),
    )
    with torch.no_grad():
        error = float((model(test)[:, 0] - exact(test)).norm() / exact(test).norm())
    print(f"{lma.steps} LM steps, {points.draws} draws: relative L2 error {error:.2e}")


if __name__ == "__main__":
    main()
