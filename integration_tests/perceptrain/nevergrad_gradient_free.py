"""Gradient-free training: ``Trainer.set_use_grad(False)`` with a nevergrad optimizer, and
the ``disable_grad_opt`` context on a gradient trainer."""

from __future__ import annotations

from typing import Any

import nevergrad as ng
import torch
from _harness import Counters, api, full_loss, loader, run, seed_everything, sine_data


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    x, y = sine_data()
    out: dict[str, Any] = {}
    try:
        out["num_parameters"] = api("parameters").num_parameters(tiny_model())
    except Exception as exc:
        out["num_parameters"] = type(exc).__name__

    # set_use_grad(False) before the Trainer is made
    seed_everything()  # each run from the same start, whatever fit() drew
    model = tiny_model()
    counters.watch_model(model)
    size = sum(p.numel() for p in model.parameters())
    config = TrainConfig(max_iter=30, print_every=10, root_folder="runs_class_level")
    optimizer = ng.optimizers.NGOpt(budget=config.max_iter, parametrization=size)
    Trainer.set_use_grad(False)
    trainer = Trainer(model, optimizer, config, loss_fn="mse")
    trainer.fit(loader(x, y, batch_size=100))
    Trainer.set_use_grad(True)
    out["class_level"] = {
        "optimizer_budget": optimizer.budget,
        "num_tell": optimizer.num_tell,
        "forwards": counters.forwards,
        "full_loss": full_loss(model, x, y),
        "current_epoch": trainer.current_epoch,
    }

    # the context manager on a trainer made for gradients
    seed_everything()  # each run from the same start, whatever fit() drew
    model = tiny_model()
    gradient_optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    counters.watch_optimizer(gradient_optimizer)
    config = TrainConfig(max_iter=20, root_folder="runs_context")
    trainer = Trainer(model, gradient_optimizer, config, loss_fn="mse")
    free = ng.optimizers.OnePlusOne(budget=20, parametrization=size)
    with trainer.disable_grad_opt(free):
        trainer.fit(loader(x, y, batch_size=100))
    out["context"] = {
        "num_tell": free.num_tell,
        "use_grad_after": trainer.use_grad,
        "optimizer_after": type(trainer.optimizer).__name__,
        "full_loss": full_loss(model, x, y),
    }
    return out


if __name__ == "__main__":
    run(main)
