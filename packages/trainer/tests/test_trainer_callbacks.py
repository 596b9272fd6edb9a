"""The Trainer's hooks and callbacks at perceptrain's stages, in perceptrain's order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from marquardt.trainer import Callback, Trainer, TrainingStage

from .training import batch_loss, make_config, make_model, sinc_loader

pytestmark = pytest.mark.usefixtures("restore_use_grad")


class Recording(Trainer):
    """A subclass overriding perceptrain's hook methods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[str] = []

    def on_train_start(self) -> None:
        self.events.append("on_train_start")

    def on_train_end(self, train_losses: Any, val_losses: Any = None) -> None:
        self.events.append(f"on_train_end{len(train_losses)},{len(val_losses)}")

    def on_train_epoch_start(self) -> None:
        self.events.append(f"on_epoch_start{self.current_epoch}")

    def on_train_epoch_end(self, results: Any) -> None:
        self.events.append(f"on_epoch_end{self.current_epoch}:{len(results)}")

    def on_train_batch_end(self, loss_metrics: Any) -> None:
        self.events.append(f"on_batch_end{self.global_step}")

    def on_val_epoch_end(self, results: Any) -> None:
        self.events.append(f"on_val_end{self.current_epoch}")

    def on_val_batch_start(self, batch: Any) -> None:
        self.events.append("on_val_batch")


def _record(events: list[str], name: str) -> Callback:
    def record(trainer: Any, config: Any, writer: Any) -> None:
        events.append(f"{name}{trainer.opt_result.iteration}")

    return Callback(on=name, called_every=1, callback=record)


def test_hooks_and_callbacks_run_at_perceptrain_s_stages_in_order(tmp_path: Path) -> None:
    model = make_model()
    events: list[str] = []
    callbacks = [
        _record(events, s) for s in ("train_start", "train_epoch_end", "val_epoch_end", "train_end")
    ]
    config = make_config(tmp_path, max_iter=2, val_every=2, write_every=0, callbacks=callbacks)
    trainer = Recording(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
    trainer.events = events
    trainer.fit(sinc_loader(batch_size=32), sinc_loader(batch_size=64))
    assert events == [
        "on_val_batch",  # the validation before training: callbacks skip epoch 0
        "train_start0",
        "on_train_start",
        "on_epoch_start0", "on_batch_end1", "on_batch_end2", "on_epoch_end0:2",
        "on_val_batch", "on_val_end0",
        "on_epoch_start1", "on_batch_end3", "on_batch_end4", "train_epoch_end1",
        "on_epoch_end1:2",
        "on_epoch_start2", "on_batch_end5", "on_batch_end6", "train_epoch_end2",
        "on_epoch_end2:2",
        "on_val_batch", "val_epoch_end2", "on_val_end2",
        "on_train_end3,2",
        "train_end2",
    ]  # fmt: skip
    assert trainer.training_stage is TrainingStage.IDLE


def test_called_every_condition_and_modify_optimize_result(tmp_path: Path) -> None:
    seen: list[tuple[int, Any]] = []

    def remember(trainer: Any, config: Any, writer: Any) -> int:
        seen.append((trainer.opt_result.iteration, trainer.opt_result.extra.get("tag")))
        return 1

    callback = Callback(
        on="train_epoch_end",
        called_every=2,
        callback=remember,
        callback_condition=lambda opt: opt.iteration != 4,
        modify_optimize_result={"tag": "x"},
    )
    model = make_model()
    config = make_config(tmp_path, max_iter=6, write_every=0, callbacks=[callback])
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config).fit(
        sinc_loader(batch_size=64)
    )
    assert seen == [(2, "x"), (6, "x")]


class Subclassed(Callback):
    def __init__(self) -> None:
        super().__init__(on="train_batch_end", called_every=3)
        self.calls = 0

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        self.calls += 1
        assert writer is not None and trainer.accelerator.rank == 0


def test_a_run_callback_subclass_runs_every_called_every_epochs(tmp_path: Path) -> None:
    callback = Subclassed()
    model = make_model()
    config = make_config(tmp_path, max_iter=6, callbacks=[callback])
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config).fit(
        sinc_loader(batch_size=32)
    )
    assert callback.calls == 4  # two batches in each of epochs 3 and 6


def test_a_bad_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="Invalid value for 'on'"):
        Callback(on="after_epoch")
    with pytest.raises(ValueError, match="called_every must be a whole number"):
        Callback(on="train_end", called_every=1.5)  # type: ignore[arg-type]


def test_test_runs_its_batches_with_their_hooks(tmp_path: Path) -> None:
    model = make_model()
    trainer = Recording(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_config(tmp_path),
        loss_fn=batch_loss,
        train_dataloader=sinc_loader(),
        test_dataloader=sinc_loader(batch_size=32),
    )
    results = trainer.test()
    assert len(results) == 2 and set(results[0][1]) == {"test_mae", "test_loss"}
    assert torch.isclose(results[0][0], results[0][1]["test_loss"])
