"""Callback state in checkpoints: the round trip, the keys, the rule for a changed callback
list, old checkpoints, and an in-process resume that stops where the straight run stops."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import (
    Callback,
    CheckpointMismatchError,
    ConfigError,
    EarlyStopping,
    TrainConfig,
    Trainer,
)
from marquardt.trainer._persistence import _callback_state as callback_state
from marquardt.trainer._persistence import _files as ckpt

#: Validation losses that improve, stall, improve and stall for good.
VALUES = [1.0, 0.9, 0.95, 0.92, 0.8, 0.85, 0.81, 0.82, 0.83, 0.84]


def _fake_trainer() -> Any:
    return SimpleNamespace(
        state=SimpleNamespace(current_epoch=0, should_stop=False, stop_reason=""),
        opt_result=SimpleNamespace(iteration=1, metrics={}, extra={}),
    )


def _feed(stopper: EarlyStopping, values: list[float], start: int = 0) -> int | None:
    """Feed validation losses; the index (from ``start``) at which the stopper stopped."""
    trainer = _fake_trainer()
    for i, value in enumerate(values, start=start):
        trainer.state.current_epoch = i
        trainer.opt_result.metrics = {"val_loss": value}
        stopper("val_epoch_end", trainer, None, None)
        if trainer.state.should_stop:
            return i
    return None


def test_early_stopping_state_round_trips_through_a_weights_only_file() -> None:
    straight = EarlyStopping(patience=3, min_delta=0.005)
    stop = _feed(straight, VALUES)
    assert stop == 7 and straight.best == 0.8
    for cut in range(1, stop):
        first = EarlyStopping(patience=3, min_delta=0.005)
        assert _feed(first, VALUES[:cut]) is None
        buffer = io.BytesIO()
        torch.save(first.state_dict(), buffer)
        buffer.seek(0)
        second = EarlyStopping(patience=3, min_delta=0.005)
        second.load_state_dict(torch.load(buffer, weights_only=True))
        assert second.state_dict() == first.state_dict()
        assert _feed(second, VALUES[cut:], start=cut) == stop, cut
        assert second.best == straight.best and second.stopped_at == straight.stopped_at


def test_a_fresh_early_stopping_decides_otherwise_so_the_state_matters() -> None:
    first = EarlyStopping(patience=3, min_delta=0.005)
    _feed(first, VALUES[:6])
    assert first.bad_validations == 1
    fresh = EarlyStopping(patience=3, min_delta=0.005)
    assert _feed(fresh, VALUES[6:], start=6) == 9  # not 7, where the straight run stops
    assert fresh.best == 0.81


def test_early_stopping_refuses_a_state_without_its_counters() -> None:
    with pytest.raises(ValueError, match=r"no bad_validations.*HINT"):
        EarlyStopping().load_state_dict({"best": 1.0})


def test_the_base_callback_has_no_state() -> None:
    callback = Callback()
    assert callback.state_dict() == {}
    callback.load_state_dict({})
    assert callback_state.capture([callback]) == {}


def test_keys_name_the_monitor_and_number_repeats() -> None:
    callbacks = [
        EarlyStopping(),
        EarlyStopping(monitor="val_acc", mode="max"),
        EarlyStopping(patience=5),
        Callback(),
    ]
    assert callback_state.keys(callbacks) == [
        "EarlyStopping(monitor=val_loss, mode=min)",
        "EarlyStopping(monitor=val_acc, mode=max)",
        "EarlyStopping(monitor=val_loss, mode=min) #2",
        "Callback",
    ]


class _Opaque(Callback):
    def state_dict(self) -> dict[str, Any]:
        return {"handle": object()}


class _NotADict(Callback):
    def state_dict(self) -> Any:
        return [1, 2]


def test_state_a_checkpoint_cannot_hold_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"_Opaque.state_dict\(\)\['handle'\] is a object.*HINT"):
        callback_state.capture([_Opaque()])
    with pytest.raises(ConfigError, match=r"returned a list.*HINT"):
        callback_state.capture([_NotADict()])


def test_a_changed_callback_list_follows_the_documented_rule(tmp_path: Path) -> None:
    stopper = EarlyStopping(patience=3)
    _feed(stopper, VALUES[:3])
    data = {"callbacks": [callback_state.capture([stopper])]}
    path = tmp_path / "ckpt.pt"
    # Same callbacks, plus a new one: the new one starts fresh, the old one is restored.
    again, added = EarlyStopping(patience=5), EarlyStopping(monitor="val_acc", mode="max")
    callback_state.check(data, path, [added, again])
    callback_state.restore(data, [added, again], rank=0, world_size=1)
    assert (again.best, again.bad_validations) == (0.9, 1) and again.patience == 5
    assert added.best is None
    # Saved state nobody claims (EarlyStopping removed, or monitoring something else).
    for callbacks in ([], [Callback()], [EarlyStopping(monitor="val_acc")]):
        with pytest.raises(CheckpointMismatchError, match=r"holds the state of callback.*HINT"):
            callback_state.check(data, path, callbacks)

    class EarlyStopping2(Callback):
        state_key = "EarlyStopping(monitor=val_loss, mode=min)"  # type: ignore[assignment]

    with pytest.raises(CheckpointMismatchError, match="saved by EarlyStopping, now"):
        callback_state.check(data, path, [EarlyStopping2()])


def test_each_rank_takes_back_its_own_state_or_rank_zero_s() -> None:
    states = []
    for best in (1.0, 2.0):
        stopper = EarlyStopping()
        _feed(stopper, [best])
        states.append(callback_state.capture([stopper]))
    data = {"callbacks": states}
    for rank, world, expected in ((0, 2, 1.0), (1, 2, 2.0), (2, 4, 1.0)):
        target = EarlyStopping()
        callback_state.restore(data, [target], rank=rank, world_size=world)
        assert target.best == expected


# --- through the trainer, in one process ------------------------------------------------


def _loader() -> DataLoader:  # type: ignore[type-arg]
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    return DataLoader(TensorDataset(x, torch.sinc(3 * x)), batch_size=32, shuffle=True)


def _fit(folder: Path, max_iter: int, stopper: EarlyStopping, **kw: Any) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    config = TrainConfig(
        max_iter=max_iter,
        root_folder=folder,
        verbose=False,
        seed=0,
        val_every=2,
        checkpoint_every=3,
        callbacks=[stopper],
        **kw,
    )
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5), config)
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    trainer.fit(_loader(), DataLoader(TensorDataset(x, torch.sinc(3 * x)), batch_size=64))
    return trainer


def _stopper() -> EarlyStopping:
    return EarlyStopping(patience=3, min_delta=1e-3)


def test_a_resumed_run_stops_at_the_epoch_of_the_uninterrupted_run(tmp_path: Path) -> None:
    straight = _stopper()
    _fit(tmp_path / "a", 150, straight)
    assert straight.stopped_at is not None and straight.stopped_at < 150
    cut = straight.stopped_at - 2  # checkpointed after a validation without improvement
    first = _stopper()
    _fit(tmp_path / "b", cut, first)
    assert first.bad_validations >= 1
    resumed = _stopper()
    trainer = _fit(tmp_path / "b", 150, resumed, resume_from="latest")
    assert trainer.current_epoch == resumed.stopped_at == straight.stopped_at
    assert resumed.best == straight.best


def test_a_checkpoint_without_callback_state_still_resumes(tmp_path: Path) -> None:
    first = _stopper()
    run = Path(_fit(tmp_path, 6, first).config.log_folder)
    (_, path), *_ = reversed(ckpt.list_checkpoints(run / "checkpoints"))
    data = ckpt.read_checkpoint(path)
    del data["callbacks"]  # as written before callbacks were checkpointed
    torch.save(data, path)
    resumed = _stopper()
    trainer = _fit(tmp_path, 10, resumed, resume_from=str(path))
    assert trainer.current_epoch == 10 and trainer.config.log_folder == run
    assert resumed.best is not None and resumed.best != first.best  # started fresh at epoch 6


def test_resuming_without_a_stateful_callback_fails_before_any_work(tmp_path: Path) -> None:
    _fit(tmp_path, 6, _stopper())
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    before = [p.detach().clone() for p in model.parameters()]
    config = TrainConfig(max_iter=10, root_folder=tmp_path, verbose=False, resume_from="latest")
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
    with pytest.raises(CheckpointMismatchError, match="EarlyStopping"):
        trainer.fit(_loader())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
    assert trainer.state.step == 0


def test_a_spawning_caller_gets_rank_zero_s_callback_state_back(tmp_path: Path) -> None:
    from marquardt.trainer._persistence._handback import apply_result, read_result, write_result

    run = _stopper()
    worker = _fit(tmp_path, 12, run)  # stands for rank 0 of a spawn
    assert run.best is not None
    write_result(worker.run_context(), str(tmp_path / "result.pt"))
    caller_stopper = _stopper()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    config = TrainConfig(root_folder=tmp_path / "caller", verbose=False, callbacks=[caller_stopper])
    caller = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5), config)
    assert caller.loop is not None
    apply_result(
        read_result(str(tmp_path / "result.pt")), caller.loop, None, config.callbacks, caller.state
    )
    assert caller_stopper.state_dict() == run.state_dict()
