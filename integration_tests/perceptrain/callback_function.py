"""``Callback(on=..., called_every=..., callback=fn)``: when each one runs, and how often."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, full_loss, loader, run, sine_data, small_model


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    Callback = api("callbacks").Callback
    calls: dict[str, list[int]] = {}

    def recorder(name: str) -> Any:
        def record(trainer: Any, config: Any, writer: Any) -> None:
            calls.setdefault(name, []).append(trainer.current_epoch)

        return record

    callbacks = [
        Callback(on="train_epoch_end", called_every=2, callback=recorder("epoch_end_every_2")),
        Callback(on="train_epoch_start", called_every=3, callback=recorder("epoch_start_every_3")),
        Callback(on="train_batch_end", called_every=4, callback=recorder("batch_end_every_4")),
        Callback(on="train_start", called_every=5, callback=recorder("train_start")),
        Callback(on="train_end", called_every=5, callback=recorder("train_end")),
        Callback(on="val_epoch_end", called_every=2, callback=recorder("val_epoch_end_every_2")),
        Callback(
            on="train_epoch_end",
            called_every=1,
            callback=recorder("epoch_end_if_odd"),
            callback_condition=lambda result: result.iteration % 2 == 1,
        ),
    ]
    x, y = sine_data()
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    config = TrainConfig(max_iter=10, val_every=1, callbacks=callbacks)
    trainer = Trainer(
        model,
        optimizer,
        config,
        loss_fn="mse",
        train_dataloader=loader(x, y),
        val_dataloader=loader(x, y, batch_size=50),
    )
    trainer.fit()
    return {"calls": calls, "full_loss": full_loss(model, x, y)}


if __name__ == "__main__":
    run(main)
