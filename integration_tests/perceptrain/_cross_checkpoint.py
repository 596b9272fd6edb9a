"""One side of a checkpoint exchange between perceptrain 0.1.0 and marquardt.trainer.

    TRAINER_MODULE=perceptrain python _cross_checkpoint.py write FOLDER
    TRAINER_MODULE=marquardt.trainer python _cross_checkpoint.py load FOLDER

``write`` trains the harness's small model with Adam for epochs 0 to 3, a checkpoint every
3 epochs and the best one on a validation loader, in a run folder under ``FOLDER``, and
prints the trained weights. ``load`` finds that run folder, loads its newest checkpoint, and
then its best one by name, into fresh models and optimizers with the package's
``load_checkpoint``, and prints what it loaded. Each prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from _harness import api, loader, seed_everything, sine_data, small_model


def _weights(model: torch.nn.Module) -> list[float]:
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def write(folder: Path) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    torch.set_default_dtype(torch.float64)
    seed_everything()
    x, y = sine_data()
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    config = TrainConfig(
        max_iter=3,
        checkpoint_every=3,
        root_folder=folder,
        val_every=1,
        checkpoint_best_only=False,
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
    best = small_model()
    best.load_state_dict(model.state_dict())
    api().write_checkpoint(Path(config.log_folder), best, optimizer, "best")
    return {
        "run_folder": str(config.log_folder),
        "weights": _weights(model),
        "adam_steps": [int(s["step"]) for s in optimizer.state.values()],
    }


def load(folder: Path) -> dict[str, Any]:
    torch.set_default_dtype(torch.float64)
    (run,) = [p for p in folder.iterdir() if p.is_dir()]
    load_checkpoint = api().load_checkpoint
    out: dict[str, Any] = {"files": sorted(p.name for p in run.iterdir() if p.suffix == ".pt")}
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model, optimizer, iteration = load_checkpoint(run, model, optimizer)
    out["latest"] = {
        "iteration": iteration,
        "weights": _weights(model),
        "adam_steps": [int(s["step"]) for s in optimizer.state.values()],
    }
    names = out["files"]
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    load_checkpoint(
        run,
        model,
        optimizer,
        model_ckpt_name=next(n for n in names if n.startswith("model_") and "_best_" in n),
        opt_ckpt_name=next(n for n in names if n.startswith("opt_") and "_best_" in n),
    )
    out["best"] = {
        "weights": _weights(model),
        "adam_steps": [int(s["step"]) for s in optimizer.state.values()],
    }
    return out


if __name__ == "__main__":
    action, where = sys.argv[1], Path(sys.argv[2])
    result = write(where) if action == "write" else load(where)
    print(json.dumps(result))
