"""A plain perceptrain script (``max_iter``, ``print_every``, ``write_every``,
``checkpoint_every``, ``val_every``) and the warnings it earns from the package.

Every warning raised while the script builds its configuration and trainer and trains is
recorded; those attributed to the script or to the package under test are reported (the
package's own warnings point at the user's line). Neither package gives any.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from _harness import Counters, api, full_loss, loader, run, sine_data, small_model


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    package = str(Path(api().__file__).parent)
    x, y = sine_data()
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    counters.watch_optimizer(optimizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = TrainConfig(
            max_iter=6, print_every=3, write_every=2, checkpoint_every=3, val_every=3
        )
        trainer = Trainer(
            model,
            optimizer,
            config,
            loss_fn="mse",
            train_dataloader=loader(x, y, batch_size=25),
            val_dataloader=loader(x, y, batch_size=50),
        )
        trainer.fit()
    ours = [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if w.filename == __file__ or w.filename.startswith(package)
    ]
    return {"warnings": ours, "full_loss": full_loss(model, x, y)}


if __name__ == "__main__":
    run(main)
