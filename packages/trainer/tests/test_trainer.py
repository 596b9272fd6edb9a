"""The training loops in one process under perceptrain's meanings: epochs, optimisers and
accumulation, losses, stopping, printing, validation, gradient-free training. Hooks and
callbacks are in test_trainer_callbacks.py, resume and run folders in
test_trainer_resume.py, refusals in test_trainer_refusals.py, the LM loop in
test_trainer_lm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.testing.models import flat
from marquardt.trainer import Callback, ConfigError, EarlyStopping, OptimizeResult, Trainer

from .conftest import read_csv
from .training import batch_loss, checkpoint_steps, full_loss, make_config, make_model, sinc_loader

pytestmark = pytest.mark.usefixtures("restore_use_grad")


def test_fit_trains_max_iter_plus_one_epochs_of_every_batch(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    start = full_loss(model)
    trainer = Trainer(model, optimizer, make_config(tmp_path))
    out_model, out_opt = trainer.fit(sinc_loader(shuffle=True))
    assert out_model is model and out_opt is optimizer
    assert (trainer.global_step, trainer.current_epoch) == (32, 3)  # epochs 0-3 of 8 batches
    assert full_loss(model) < 0.5 * start
    rows = list(read_csv(tmp_path / "metrics.csv"))
    # epochs 1, 2, 3 (callbacks skip epoch 0), then the last epoch again at the end
    assert [(int(r["epoch"]), int(r["step"])) for r in rows] == [(1, 16), (2, 24), (3, 32)] * 1 + [
        (3, 32)
    ]
    assert (tmp_path / "hparams.json").exists()
    assert isinstance(trainer.opt_result, OptimizeResult) and trainer.opt_result.iteration == 3
    assert set(trainer.opt_result.metrics) == {"train_loss"}


def test_the_seed_s_config_takes_perceptrain_s_number_of_steps(tmp_path: Path) -> None:
    model = make_model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        make_config(tmp_path, max_iter=50, write_every=0),
    )
    trainer.fit(sinc_loader(batch_size=10))  # 64 samples in 7 batches
    assert trainer.global_step == 357 and trainer.current_epoch == 50


def test_a_second_fit_trains_its_epochs_again_from_the_model_as_it_is(tmp_path: Path) -> None:
    starts: list[float] = []

    class Recording(Trainer):
        def on_train_start(self) -> None:
            starts.append(full_loss(self.model))

    model = make_model()
    trainer = Recording(model, torch.optim.SGD(model.parameters(), lr=0.2), make_config(tmp_path))
    trainer.fit(sinc_loader())
    first_run = trainer.config.log_folder
    after_first = full_loss(model)
    trainer.fit(sinc_loader(batch_size=16))  # 4 batches an epoch
    assert (trainer.global_step, trainer.current_epoch) == (16, 3)  # epochs 0-3 again
    assert starts[1] == after_first  # went on from the trained weights
    assert trainer.config.log_folder != first_run  # a run folder of its own
    assert len(list(read_csv(Path(first_run) / "metrics.csv"))) == 4  # the first run kept whole


def test_lbfgs_works_through_the_closure(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    start = full_loss(model)
    Trainer(model, optimizer, make_config(tmp_path, max_iter=10)).fit(sinc_loader(batch_size=64))
    assert full_loss(model) < 0.2 * start


def test_gradient_accumulation_equals_the_larger_batch(tmp_path: Path) -> None:
    a, b = make_model(), make_model()
    Trainer(
        a, torch.optim.SGD(a.parameters(), lr=0.1), make_config(tmp_path / "a", max_iter=3)
    ).fit(sinc_loader(batch_size=16))
    trainer = Trainer(
        b,
        torch.optim.SGD(b.parameters(), lr=0.1),
        make_config(tmp_path / "b", max_iter=3, accumulate_grad_batches=2),
    )
    trainer.fit(sinc_loader(batch_size=8))
    assert trainer.global_step == 16
    assert torch.allclose(flat(a), flat(b), atol=1e-6)


def test_grad_clip_bounds_the_step(tmp_path: Path) -> None:
    model = make_model()
    before = flat(model)
    Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        make_config(tmp_path, max_iter=0, grad_clip=1e-3),
    ).fit(sinc_loader(batch_size=64))
    assert float((flat(model) - before).norm()) <= 1e-3 + 1e-7


def test_perceptrain_loss_with_metrics_and_a_criterion_both_work(tmp_path: Path) -> None:
    a, b = make_model(), make_model()
    first = Trainer(
        a, torch.optim.SGD(a.parameters(), lr=0.1), make_config(tmp_path / "a"), loss_fn=batch_loss
    )
    first.fit(sinc_loader())
    Trainer(
        b,
        torch.optim.SGD(b.parameters(), lr=0.1),
        make_config(tmp_path / "b"),
        loss_fn=lambda out, target: ((out - target) ** 2).mean(),
    ).fit(sinc_loader())
    assert torch.allclose(flat(a), flat(b), atol=1e-6)
    assert set(first.opt_result.metrics) == {"train_mae", "train_loss"}  # type: ignore[union-attr]
    assert "train_mae" in read_csv(tmp_path / "a" / "metrics.csv")[0]


class SelfLoss(nn.Module):
    """A model that computes its own loss (no data), as qadence's VQE examples do."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor([2.0]))

    def forward(self) -> torch.Tensor:
        return ((self.theta - 0.5) ** 2).sum()


def test_fit_without_data_evaluates_the_model_s_own_loss(tmp_path: Path) -> None:
    model = SelfLoss()
    seen: list[Any] = []

    def loss_fn(batch: Any, model: nn.Module) -> tuple[torch.Tensor, dict[str, Any]]:
        seen.append(batch)
        return model(), {}

    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_config(tmp_path, max_iter=49),
        loss_fn,
    )
    trainer.fit()
    assert trainer.global_step == 50 and len(seen) == 50 and set(seen) == {None}
    assert abs(float(model.theta) - 0.5) < 1e-3


def test_a_callback_stops_training_through_the_trainer_flag(tmp_path: Path) -> None:
    def stop(trainer: Any, config: Any, writer: Any) -> None:
        trainer._stop_training.fill_(1)

    model = make_model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_config(tmp_path, max_iter=50, callbacks=[Callback("train_epoch_end", 3, stop)]),
    )
    trainer.fit(sinc_loader())
    assert trainer.current_epoch == 3 and trainer.stop_training()


def test_print_every_prints_the_epoch_mean_in_perceptrain_s_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model()
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_config(tmp_path, max_iter=6, print_every=3, verbose=True),
        loss_fn=batch_loss,
    )
    losses: list[float] = []

    def remember(t: Any, c: Any, w: Any) -> None:
        losses.append(float(t.opt_result.metrics["train_loss"]))

    trainer.config.callbacks.append(Callback("train_epoch_end", 3, remember))
    trainer.fit(sinc_loader())
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("P ")]
    assert lines == [
        f"P  0|cpu    | Iteration {epoch: >7}| Train_Loss: {loss:.7f} -train_mae: "
        + lines[i].split("train_mae: ")[1]
        for i, (epoch, loss) in enumerate(zip((3, 6), losses, strict=True))
    ]


def test_validation_keeps_the_best_checkpoint_and_early_stopping_stops(tmp_path: Path) -> None:
    model = make_model()
    stopper = EarlyStopping(patience=2)
    # lr = 0: the validation loss never improves after the first validation.
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        make_config(
            tmp_path,
            max_iter=100,
            val_every=3,
            checkpoint_best_only=True,
            validation_criterion=lambda val, best, eps: val < best - eps,
            callbacks=[stopper],
        ),
    )
    trainer.fit(sinc_loader(), val_dataloader=sinc_loader(batch_size=64))
    assert trainer.current_epoch == 9 and stopper.stopped_at == 9
    assert "early stopping" in trainer.state.stop_reason
    assert (tmp_path / "checkpoints" / "best.pt").exists()
    assert checkpoint_steps(tmp_path) == []  # best only
    rows = [r for r in read_csv(tmp_path / "metrics.csv") if r["phase"] == "val"]
    assert [int(r["epoch"]) for r in rows] == [0, 3, 6, 9]


def test_validation_needs_validation_data(tmp_path: Path) -> None:
    model = make_model()
    trainer = Trainer(
        model, torch.optim.SGD(model.parameters()), make_config(tmp_path, val_every=1)
    )
    with pytest.raises(ConfigError, match=r"val_every=1\) but there is no validation data"):
        trainer.fit(sinc_loader())


# --------------------------------------------------------------------- bad input
def test_set_use_grad_false_means_gradient_free(tmp_path: Path) -> None:
    Trainer.set_use_grad(False)
    model = make_model()
    with pytest.raises(ConfigError, match=r"trains gradient-free with a nevergrad optimizer.*HINT"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), make_config(tmp_path))
    Trainer.set_use_grad(True)
    trainer = Trainer(model, None, make_config(tmp_path, max_iter=0))
    with pytest.raises(ConfigError, match="no optimizer"):
        trainer.fit(sinc_loader())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainer.enable_grad_opt(sgd):
        assert trainer.optimizer is sgd and trainer.use_grad
        trainer.fit(sinc_loader())
    assert trainer.optimizer is None and trainer.global_step == 8
    with (
        pytest.raises(ConfigError, match="gradient-free"),
        trainer.disable_grad_opt(sgd),
    ):
        pass
    assert trainer.use_grad
