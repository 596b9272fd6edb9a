"""The built-in callbacks placed by hand: print, write, plot, checkpoints, hyperparameters.

``PrintMetrics``, ``WriteMetrics``, ``WritePlots``, ``SaveCheckpoint``, ``SaveBestCheckpoint``,
``LoadCheckpoint``, ``LogHyperparameters``, ``LogModelTracker``, ``GradientMonitoring``, with
the TensorBoard writer (perceptrain's default); no ``*_every`` field is set.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import torch
from _harness import Counters, api, full_loss, loader, run, sine_data, small_model


def plot_fit(model: torch.nn.Module, iteration: int) -> tuple[str, Any]:
    x, y = sine_data(20)
    figure, axes = plt.subplots()
    with torch.no_grad():
        axes.plot(x.numpy(), model(x).numpy())
    axes.plot(x.numpy(), y.numpy())
    return "fit", figure


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    cb = api("callbacks")
    x, y = sine_data()
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    config = TrainConfig(
        max_iter=8,
        val_every=2,
        validation_criterion=lambda loss, best, epsilon: loss < best - epsilon,
        plotting_functions=(plot_fit,),
        hyperparams={"lr": 0.01, "layers": 2},
        callbacks=[
            cb.PrintMetrics(on="train_epoch_end", called_every=2),
            cb.PrintMetrics(on="val_epoch_end", called_every=4),
            cb.WriteMetrics(on="train_epoch_end", called_every=3),
            cb.WritePlots(on="train_epoch_end", called_every=4),
            cb.SaveCheckpoint(on="train_epoch_end", called_every=4),
            cb.SaveBestCheckpoint(on="val_epoch_end", called_every=2),
            cb.LogHyperparameters(on="train_end", called_every=1),
            cb.LogModelTracker(on="train_end", called_every=1),
            cb.GradientMonitoring(on="train_epoch_end", called_every=8),
        ],
    )
    trainer = Trainer(
        model,
        optimizer,
        config,
        loss_fn="mse",
        train_dataloader=loader(x, y, batch_size=20),
        val_dataloader=loader(x, y, batch_size=100),
    )
    trainer.fit()
    trained = full_loss(model, x, y)

    # LoadCheckpoint on a fresh model: the latest checkpoint of the run folder.
    fresh = small_model()
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.01)
    loaded = cb.LoadCheckpoint(on="train_start", called_every=1).run_callback(trainer, config, None)
    loaded_model, _, loaded_iteration = loaded
    fresh.load_state_dict(loaded_model.state_dict())
    del fresh_optimizer
    return {
        "full_loss": trained,
        "loaded_iteration": loaded_iteration,
        "loaded_full_loss": full_loss(fresh, x, y),
    }


if __name__ == "__main__":
    run(main)
