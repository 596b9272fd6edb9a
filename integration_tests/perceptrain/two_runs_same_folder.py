"""Two runs into the same folder: each its own subfolder, or the second resumes the first.

With the default ``log_folder`` every run gets ``<id>_<time>_<pid>/`` under ``root_folder``;
with an explicit ``log_folder`` a second run resumes from the latest checkpoint there.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from _harness import (
    Counters,
    Masker,
    api,
    checkpoint_epochs,
    files_under,
    full_loss,
    loader,
    run,
    seed_everything,
    sine_data,
    small_model,
)


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    x, y = sine_data()
    out: dict[str, Any] = {}
    for layout, folder_field in (("subfolders", "root_folder"), ("resume", "log_folder")):
        runs = []
        for attempt in range(2):
            if attempt:
                time.sleep(1.1)  # another run, as a user starts it later: another time stamp
            seed_everything()  # each run from the same start, whatever fit() drew
            model = small_model()
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            steps = [0]

            def count(*_: Any, steps: list[int] = steps) -> None:
                steps[0] += 1

            optimizer.register_step_post_hook(count)
            counters.watch_optimizer(optimizer)
            config = TrainConfig(
                max_iter=4, checkpoint_every=2, write_every=2, **{folder_field: Path(layout)}
            )
            trainer = Trainer(model, optimizer, config, loss_fn="mse")
            trainer.fit(loader(x, y, batch_size=50))
            runs.append(
                {
                    "steps": steps[0],
                    "current_epoch": trainer.current_epoch,
                    "log_folder": Masker(Path.cwd())(str(config.log_folder)),
                    "files": files_under(Path(layout)),
                    "checkpoints": checkpoint_epochs(Path(layout)),
                    "full_loss": full_loss(model, x, y),
                }
            )
        out[layout] = runs
    return {"runs": out}


if __name__ == "__main__":
    run(main)
