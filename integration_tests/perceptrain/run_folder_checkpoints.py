"""A script that lists its run folder for perceptrain's checkpoint files and loads them.

One run writes a checkpoint every 2 epochs, another only its best (``checkpoint_best_only``
with a validation criterion). The script lists ``config.log_folder`` for ``model_*.pt`` and
``opt_*.pt`` files, loads the newest with ``load_checkpoint``, and the best one by its name,
into fresh models, and reports what it found and the loaded models' losses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from _harness import (
    Counters,
    api,
    full_loss,
    loader,
    run,
    seed_everything,
    sine_data,
    small_model,
)


def _listed(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(("model_", "opt_")))


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    load_checkpoint = api().load_checkpoint
    x, y = sine_data()

    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    config = TrainConfig(max_iter=5, checkpoint_every=2, root_folder="every")
    Trainer(model, optimizer, config, loss_fn="mse").fit(loader(x, y, batch_size=25))
    folder = Path(config.log_folder)
    fresh = small_model()
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.01)
    _, _, iteration = load_checkpoint(folder, fresh, fresh_optimizer)
    every = {
        "files": _listed(folder),
        "loaded_iteration": iteration,
        "loaded_loss": full_loss(fresh, x, y),
        "trained_loss": full_loss(model, x, y),
        "loaded_adam_steps": [float(s["step"]) for s in fresh_optimizer.state.values()][:1],
    }

    seed_everything()  # the second run from the same start, whatever the first one drew
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    config = TrainConfig(
        max_iter=6,
        val_every=2,
        checkpoint_best_only=True,
        validation_criterion=lambda loss, best, eps: loss < best - eps,
        root_folder="best",
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
    folder = Path(config.log_folder)
    names = _listed(folder)
    model_name = next(n for n in names if n.startswith("model_") and "_ckpt_best_" in n)
    opt_name = next(n for n in names if n.startswith("opt_") and "_ckpt_best_" in n)
    fresh = small_model()
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.01)
    load_checkpoint(
        folder, fresh, fresh_optimizer, model_ckpt_name=model_name, opt_ckpt_name=opt_name
    )
    best = {
        "files": names,
        "loaded_loss": full_loss(fresh, x, y),
        "trained_loss": full_loss(model, x, y),
    }
    return {"every": every, "best": best}


if __name__ == "__main__":
    run(main)
