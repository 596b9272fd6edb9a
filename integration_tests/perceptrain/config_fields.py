"""The ``TrainConfig`` fields a perceptrain user sets beside the periods.

``plot_every`` with ``plotting_functions``, ``log_model``, ``checkpoint_best_only`` with
``validation_criterion`` and ``val_epsilon``, ``trainstop_criterion``, ``batch_size``,
``log_setup``, ``hyperparams``, ``checkpoint_every``, ``write_every``, ``live_plot_every``.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import torch
from _harness import Counters, api, full_loss, loader, run, sine_data, small_model

FIELDS = (
    "max_iter", "print_every", "write_every", "checkpoint_every", "plot_every",
    "live_plot_every", "callbacks", "log_model", "root_folder", "create_subfolder_per_run",
    "log_folder", "checkpoint_best_only", "val_every", "val_epsilon", "validation_criterion",
    "trainstop_criterion", "batch_size", "verbose", "tracking_tool", "hyperparams",
    "plotting_functions", "nprocs", "compute_setup", "backend", "log_setup", "dtype",
    "all_reduce_metrics",
)  # fmt: skip


def plot_fit(model: torch.nn.Module, iteration: int) -> tuple[str, Any]:
    x, y = sine_data(20)
    figure, axes = plt.subplots()
    with torch.no_grad():
        axes.plot(x.numpy(), model(x).numpy())
    axes.plot(x.numpy(), y.numpy())
    return "fit", figure


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    defaults = TrainConfig()
    shown_defaults = {}
    for name in FIELDS:
        value = getattr(defaults, name, "<missing>")
        shown_defaults[name] = value if isinstance(value, (int, float, bool, str)) else repr(value)
    x, y = sine_data()
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    improvements: list[list[float]] = []

    def criterion(loss: Any, best: Any, epsilon: float) -> bool:
        improvements.append([float(loss), float(best), epsilon])
        return bool(loss < best - epsilon)

    config = TrainConfig(
        max_iter=9,
        val_every=3,
        write_every=3,
        plot_every=3,
        live_plot_every=0,
        plotting_functions=(plot_fit,),
        log_model=True,
        checkpoint_every=4,
        checkpoint_best_only=True,
        validation_criterion=criterion,
        val_epsilon=1e-3,
        trainstop_criterion=lambda *args: False,
        batch_size=8,
        log_setup="cpu",
        hyperparams={"lr": 0.01},
        root_folder="runs",
    )
    trainer = Trainer(
        model,
        optimizer,
        config,
        loss_fn="mse",
        train_dataloader=loader(x, y, batch_size=50),
        val_dataloader=loader(x, y, batch_size=100),
    )
    trainer.fit()
    return {
        "defaults": shown_defaults,
        "validation_criterion_calls": improvements,
        "full_loss": full_loss(model, x, y),
    }


if __name__ == "__main__":
    run(main)
