"""Data given to the constructor (train, val, test), ``fit()`` with no argument, ``test()``."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, full_loss, loader, number, run, sine_data, small_model


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    x, y = sine_data()
    x_test, y_test = sine_data(30)
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    config = TrainConfig(max_iter=4, val_every=2, print_every=2)
    trainer = Trainer(
        model,
        optimizer,
        config,
        loss_fn="mse",
        train_dataloader=loader(x, y, batch_size=30),
        val_dataloader=loader(x, y, batch_size=100),
        test_dataloader=loader(x_test, y_test, batch_size=10),
    )
    returned = trainer.fit()
    out: dict[str, Any] = {
        "fit_returns": [type(v).__name__ for v in returned],
        "steps_after_fit": counters.steps,
        "full_loss": full_loss(model, x, y),
    }
    tested = trainer.test(loader(x_test, y_test, batch_size=10))
    out["test"] = [[number(loss), sorted(metrics)] for loss, metrics in tested]
    # test() without an argument: the test data given to the constructor
    try:
        tested = trainer.test()
        out["test_default"] = [[number(loss), sorted(metrics)] for loss, metrics in tested]
    except Exception as exc:
        out["test_default"] = f"{type(exc).__name__}"
    # fit again, with new training data as a keyword: training continues from the last epoch
    trainer.fit(train_dataloader=loader(x, y, batch_size=50))
    out["second_fit"] = {"steps": counters.steps, "current_epoch": trainer.current_epoch}
    return out


if __name__ == "__main__":
    run(main)
