"""The learning-rate callbacks: step decay, cyclic, cosine annealing, reduce on plateau."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, full_loss, loader, run, seed_everything, sine_data, small_model


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    cb = api("callbacks")
    x, y = sine_data()
    schedules = {
        "step_decay": lambda: cb.LRSchedulerStepDecay(on="train_epoch_end", called_every=3, gamma=0.5),
        "cyclic": lambda: cb.LRSchedulerCyclic(
            on="train_batch_end", called_every=1, base_lr=0.001, max_lr=0.01, step_size=4
        ),
        "cosine": lambda: cb.LRSchedulerCosineAnnealing(
            on="train_epoch_end", called_every=2, t_max=10, min_lr=1e-4
        ),
        "plateau": lambda: cb.LRSchedulerReduceOnPlateau(
            on="train_epoch_end", called_every=1, monitor="train_loss", patience=2,
            gamma=0.5, threshold=0.05, min_lr=1e-3,
        ),
    }  # fmt: skip
    out: dict[str, Any] = {}
    for name, make in schedules.items():
        seed_everything()  # each run from the same start, whatever fit() drew
        model = small_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        counters.watch_optimizer(optimizer)
        lrs: list[list[float]] = []

        def record(trainer: Any, config: Any, writer: Any, lrs: list[list[float]] = lrs) -> None:
            lrs.append([trainer.current_epoch, trainer.optimizer.param_groups[0]["lr"]])

        config = TrainConfig(
            max_iter=10,
            root_folder=f"runs_{name}",
            callbacks=[make(), cb.Callback(on="train_epoch_end", called_every=1, callback=record)],
        )
        trainer = Trainer(model, optimizer, config, loss_fn="mse")
        trainer.fit(loader(x, y, batch_size=25))
        out[name] = {"lr": lrs, "full_loss": full_loss(model, x, y)}
    return {"schedules": out}


if __name__ == "__main__":
    run(main)
