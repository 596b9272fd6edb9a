"""A ``Callback`` subclass with ``run_callback(trainer, config, writer)`` reading the run's state."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, full_loss, loader, number, run, sine_data, small_model


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    Callback = api("callbacks").Callback
    seen: list[dict[str, Any]] = []

    class Observe(Callback):  # type: ignore[misc, valid-type]
        def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
            result = trainer.opt_result
            seen.append(
                {
                    "on": str(self.on),
                    "current_epoch": trainer.current_epoch,
                    "global_step": trainer.global_step,
                    "iteration": result.iteration,
                    "loss": number(result.loss),
                    "metrics": sorted(result.metrics),
                    "max_iter": config.max_iter,
                    "writer": type(writer).__name__,
                }
            )

    x, y = sine_data()
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    counters.watch_optimizer(optimizer)
    config = TrainConfig(
        max_iter=6,
        callbacks=[
            Observe(on="train_epoch_end", called_every=3),
            Observe(on="train_end", called_every=1),
        ],
    )
    trainer = Trainer(model, optimizer, config, loss_fn="mse")
    trainer.fit(train_dataloader=loader(x, y, batch_size=25))
    return {"seen": seen, "full_loss": full_loss(model, x, y)}


if __name__ == "__main__":
    run(main)
