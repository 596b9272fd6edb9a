"""``EarlyStopping`` on ``val_loss`` (at validation) and on ``train_loss`` (every epoch).

Adam with a learning rate too large for the problem: the loss stops improving after a few
epochs, so both monitors have a decision to make well before ``max_iter``.
"""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, full_loss, loader, run, seed_everything, sine_data, small_model


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    cb = api("callbacks")
    x, y = sine_data()
    out: dict[str, Any] = {}
    for monitor, on, val_every in (
        ("val_loss", "val_epoch_end", 2),
        ("train_loss", "train_epoch_end", 0),
    ):
        seed_everything()  # each run from the same start, whatever fit() drew
        model = small_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.3)
        counters.watch_optimizer(optimizer)
        epochs: list[int] = []

        def record(trainer: Any, config: Any, writer: Any, epochs: list[int] = epochs) -> None:
            epochs.append(trainer.current_epoch)

        stopping = cb.EarlyStopping(on=on, called_every=1, monitor=monitor, patience=3, mode="min")
        config = TrainConfig(
            max_iter=60,
            val_every=val_every,
            root_folder=f"runs_{monitor}",
            callbacks=[
                stopping,
                cb.Callback(on="train_epoch_end", called_every=1, callback=record),
            ],
        )
        trainer = Trainer(
            model,
            optimizer,
            config,
            loss_fn="mse",
            train_dataloader=loader(x, y, batch_size=25),
            val_dataloader=loader(x, y, batch_size=100) if val_every else None,
        )
        trainer.fit()
        out[monitor] = {
            "epochs_trained": epochs,
            "current_epoch": trainer.current_epoch,
            "full_loss": full_loss(model, x, y),
        }
    return {"early_stopping": out}


if __name__ == "__main__":
    run(main)
