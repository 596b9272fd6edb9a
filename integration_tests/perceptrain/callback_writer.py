"""A callback written for perceptrain that logs through ``trainer.callback_manager.writer``.

It writes a number of its own each epoch with the writer's ``write``, to TensorBoard (the
default tracking tool; the harness reads the event files back) and to MLflow, whose run it
finds as ``writer.run`` and reads back from the store. The MLflow store is a file store in
the script's folder, named through ``MLFLOW_TRACKING_URI``, which both packages honour.
"""

from __future__ import annotations

import os
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


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    Callback = api("callbacks").Callback
    os.environ["MLFLOW_TRACKING_URI"] = f"file://{os.getcwd()}/mlruns"
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 keeps the file store, opt-in
    os.environ["MLFLOW_EXPERIMENT_NAME"] = "compat"

    class LogOwnNumber(Callback):  # type: ignore[misc, valid-type]
        def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
            epoch = trainer.opt_result.iteration
            same = trainer.callback_manager.writer is writer
            trainer.callback_manager.writer.write(epoch, {"own_number": float(epoch) / 4})
            return same

    runs: dict[str, Any] = {}
    for tool in ("tensorboard", "mlflow"):
        seed_everything()  # each run from the same start, whatever the last one drew
        x, y = sine_data()
        model = small_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        counters.watch_optimizer(optimizer)
        tracking = getattr(api("types").ExperimentTrackingTool, tool.upper())
        callback = LogOwnNumber(on="train_epoch_end", called_every=2)
        config = TrainConfig(
            max_iter=6, root_folder=tool, tracking_tool=tracking, callbacks=[callback]
        )
        trainer = Trainer(model, optimizer, config, loss_fn="mse")
        trainer.fit(train_dataloader=loader(x, y, batch_size=25))
        writer = trainer.callback_manager.writer
        seen: dict[str, Any] = {
            "writer_methods": sorted(
                m
                for m in ("write", "log_hyperparams", "plot", "log_model", "print_metrics")
                if callable(getattr(writer, m, None))
            ),
            "full_loss": full_loss(model, x, y),
        }
        if tool == "mlflow":
            from mlflow.tracking import MlflowClient

            client = MlflowClient()
            history = client.get_metric_history(writer.run.info.run_id, "own_number")
            seen["mlflow_own_number"] = sorted([m.step, m.value] for m in history)
            seen["mlflow_experiment"] = client.get_experiment(writer.run.info.experiment_id).name
        runs[tool] = seen
    return {"runs": runs}


if __name__ == "__main__":
    run(main)
