"""The Trainer's LM loop with residuals that differentiate the model by its inputs: an
``LMA`` built on a ``PointResidual`` (dense, with the forward-Laplacian Jacobian, or
matrix-free) trains from a shuffled
``DataLoader`` over the batch that ``PointResidual.batch`` builds (1-D Poisson, −u'' = π² sin(πx), u(0) = u(1) = 0)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import TrainConfig, Trainer


@pytest.mark.parametrize("strategy", ["auto", "matrix_free"])
def test_lm_loop_trains_a_point_residual_from_shuffled_batches(
    tmp_path: Path, strategy: str
) -> None:
    from marquardt.jacobian import PointResidual, ResidualGroup
    from marquardt.solver import LMA

    def pde(u, x, f):  # type: ignore[no-untyped-def]
        return -u.laplacian(x) - f  # asked of u: the forward-Laplacian (taylor) mode serves it

    def boundary(u, x, _g):  # type: ignore[no-untyped-def]
        return u(x)

    residual = PointResidual(ResidualGroup("pde", pde), ResidualGroup("boundary", boundary))
    inner = torch.linspace(0, 1, 22, dtype=torch.float64)[1:-1, None]
    x, y = residual.batch(
        pde=(inner, math.pi**2 * torch.sin(math.pi * inner[:, 0])),
        boundary=torch.tensor([[0.0], [1.0]], dtype=torch.float64),
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    test = torch.linspace(0, 1, 101, dtype=torch.float64)[:, None]

    def error() -> float:
        with torch.no_grad():
            exact = torch.sin(math.pi * test[:, 0])
            return float((model(test)[:, 0] - exact).norm() / exact.norm())

    before = error()
    loader = DataLoader(TensorDataset(x, y), batch_size=len(x), shuffle=True)
    lma = LMA(model, [torch.device("cpu")], residual, strategy=strategy)
    Trainer(model, lma, TrainConfig(max_iter=24, root_folder=tmp_path)).fit(loader)  # 25 epochs
    assert lma.steps == 25
    assert lma.report is not None and lma.report.strategy == (
        "matrix_free" if strategy == "matrix_free" else "explicit"  # N = 22 < P = 25
    )
    if strategy != "matrix_free":  # the dense step's J comes from the forward Laplacian
        assert "taylor: " in lma.report.strategy_reason
    assert error() < 0.05 * before


def test_lm_loop_trains_on_collocation_points_redrawn_every_epoch(tmp_path: Path) -> None:
    """A ``Collocation`` behind a ``DataLoader`` gives each epoch's step its points; a
    validation loss function reports the error against the solution and the PDE residual
    at fixed check points as metrics, which early stopping can watch."""
    from marquardt.jacobian import Collocation, PointResidual, ResidualGroup
    from marquardt.solver import LMA
    from marquardt.trainer import Callback, EarlyStopping

    def pde(u, x, _y):  # type: ignore[no-untyped-def]
        return -torch.func.hessian(u)(x).reshape(()) - math.pi**2 * torch.sin(math.pi * x[0])

    def boundary(u, x, _g):  # type: ignore[no-untyped-def]
        return u(x)

    residual = PointResidual(ResidualGroup("pde", pde), ResidualGroup("boundary", boundary))
    points = Collocation(
        residual,
        {
            "pde": lambda n, g: torch.rand(n, 1, generator=g, dtype=torch.float64),
            "boundary": lambda n, g: torch.randint(0, 2, (n, 1), generator=g).double(),
        },
        {"pde": 12, "boundary": 2},
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    test = torch.linspace(0, 1, 101, dtype=torch.float64)[:, None]
    check_x, check_y = residual.batch(pde=test[1:-1])

    def metrics(batch, model):  # type: ignore[no-untyped-def]
        x, u = batch
        error = (model(x)[:, 0] - u).norm() / u.norm()
        params = dict(model.named_parameters())
        pde_rms = residual.rows(model, params, check_x, check_y).pow(2).mean().sqrt()
        return error, {"error": error, "pde_rms": pde_rms}

    seen: list[dict[str, float]] = []
    record = Callback(
        on="val_epoch_end",
        callback=lambda trainer, _c, _w: seen.append(
            {k: float(v) for k, v in trainer.opt_result.metrics.items()}
        ),
    )
    stop = EarlyStopping(on="val_epoch_end", monitor="val_error", patience=50)
    lma = LMA(model, [torch.device("cpu")], residual)
    config = TrainConfig(max_iter=29, val_every=5, root_folder=tmp_path, callbacks=[record, stop])
    trainer = Trainer(model, lma, config, loss_fn=metrics)
    trainer.fit(
        DataLoader(points, batch_size=None),
        DataLoader([(test, torch.sin(math.pi * test[:, 0]))], batch_size=None),
    )
    assert lma.steps == 30
    assert points.draws == 30  # one draw per epoch
    errors = [m["val_error"] for m in seen]
    assert errors[-1] < 0.02 and errors[-1] < errors[0] / 10
    assert min(m["val_pde_rms"] for m in seen[-2:]) < seen[0]["val_pde_rms"] / 3
