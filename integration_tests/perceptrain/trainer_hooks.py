"""A ``Trainer`` subclass overriding the hooks: which are called, when, with what."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, full_loss, loader, run, sine_data, small_model


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    calls: list[list[Any]] = []

    class Recording(Trainer):  # type: ignore[misc, valid-type]
        def on_train_start(self) -> None:
            calls.append(["on_train_start", self.current_epoch])

        def on_train_end(self, train_losses: Any, val_losses: Any = None) -> None:
            calls.append(["on_train_end", len(train_losses), len(val_losses or [])])

        def on_train_epoch_start(self) -> None:
            calls.append(["on_train_epoch_start", self.current_epoch])

        def on_train_epoch_end(self, train_epoch_loss_metrics: Any) -> None:
            calls.append(["on_train_epoch_end", self.current_epoch, len(train_epoch_loss_metrics)])

        def on_val_epoch_start(self) -> None:
            calls.append(["on_val_epoch_start", self.current_epoch])

        def on_val_epoch_end(self, val_epoch_loss_metrics: Any) -> None:
            calls.append(["on_val_epoch_end", self.current_epoch, len(val_epoch_loss_metrics)])

        def on_train_batch_start(self, batch: Any) -> None:
            calls.append(["on_train_batch_start", self.current_epoch, len(batch[0])])

        def on_train_batch_end(self, train_batch_loss_metrics: Any) -> None:
            _, metrics = train_batch_loss_metrics
            calls.append(["on_train_batch_end", self.current_epoch, sorted(metrics)])

        def on_val_batch_start(self, batch: Any) -> None:
            calls.append(["on_val_batch_start", self.current_epoch, len(batch[0])])

        def on_val_batch_end(self, val_batch_loss_metrics: Any) -> None:
            calls.append(
                ["on_val_batch_end", self.current_epoch, sorted(val_batch_loss_metrics[1])]
            )

    x, y = sine_data()
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    counters.watch_optimizer(optimizer)
    config = TrainConfig(max_iter=3, val_every=2)
    trainer = Recording(
        model,
        optimizer,
        config,
        loss_fn="mse",
        train_dataloader=loader(x, y, batch_size=40),
        val_dataloader=loader(x, y, batch_size=60),
    )
    trainer.fit()
    return {"hooks": calls, "full_loss": full_loss(model, x, y)}


if __name__ == "__main__":
    run(main)
