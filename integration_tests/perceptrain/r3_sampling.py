"""``R3Sampling`` with an ``R3Dataset``: the dataset renewed at epoch starts while training."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, run, small_model


def uniform(n: int) -> torch.Tensor:
    return torch.rand(n, 1)


def residual_loss(batch: Any, model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
    """A residual that wants the model to vanish on the sampled points."""
    return (model(batch) ** 2).mean(), {}


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    data, cb = api("data"), api("callbacks")
    dataset = data.R3Dataset(proba_dist=uniform, n_samples=40, release_threshold=0.3)
    updates: list[list[int]] = []
    fitness_calls: list[int] = []

    def fitness(x: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        fitness_calls.append(len(x))
        with torch.no_grad():
            return model(x).abs().squeeze(-1)

    def record(trainer: Any, config: Any, writer: Any) -> None:
        updates.append([trainer.current_epoch, dataset.n_released])

    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    config = TrainConfig(
        max_iter=6,
        callbacks=[
            cb.R3Sampling(initial_dataset=dataset, fitness_function=fitness, called_every=2),
            cb.Callback(on="train_epoch_start", called_every=1, callback=record),
        ],
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=20, shuffle=False)
    Trainer(model, optimizer, config, loss_fn=residual_loss).fit(loader)
    with torch.no_grad():
        residual = float((model(dataset.features) ** 2).mean())
    return {
        "fitness_calls": fitness_calls,
        "released_at_epoch_start": updates,
        "residual": residual,
    }


if __name__ == "__main__":
    run(main)
