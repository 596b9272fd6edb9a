"""A custom loss ``loss_fn(batch, model) -> (loss, metrics)``: its metrics printed and written."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, full_loss, loader, run, sine_data, small_model


def loss_fn(batch: Any, model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x, y = batch
    prediction = model(x)
    mse = torch.nn.functional.mse_loss(prediction, y)
    mae = (prediction - y).abs().mean()
    return mse + 0.1 * mae, {"mse": mse, "mae": mae}


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    x, y = sine_data()
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    counters.watch_model(model)
    config = TrainConfig(max_iter=6, print_every=2, write_every=3, val_every=3)
    trainer = Trainer(
        model,
        optimizer,
        config,
        loss_fn=loss_fn,
        train_dataloader=loader(x, y, batch_size=34),
        val_dataloader=loader(x, y, batch_size=100),
    )
    trainer.fit()
    return {"full_loss": full_loss(model, x, y)}


if __name__ == "__main__":
    run(main)
