"""The seeds' ``train.py`` (max_iter=50, print_every=5; 100 points in batches of 16: 7 a epoch).

The body is the seeds' script with its imports resolved through ``TRAINER_MODULE``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from _harness import Counters, api, full_loss, run, trainer_state
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    optimize_step = api("optimize_step").optimize_step
    Trainer.set_use_grad(True)

    # simple dataset for y = 2πx
    x = torch.linspace(0, 1, 100).reshape(-1, 1)
    y = torch.sin(2 * torch.pi * x)
    dataloader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    # Simple model with no hidden layer and ReLU activation to fit the data for y = 2πx
    model = nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1))
    # SGD optimizer with 0.01 learning rate
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    counters.watch_optimizer(optimizer)
    counters.watch_model(model)

    # TrainConfig
    parser = argparse.ArgumentParser()
    parser.add_argument("--nprocs", type=int, default=1)
    parser.add_argument("--compute_setup", type=str, default="auto")
    parser.add_argument("--backend", type=str, default="nccl")
    args = parser.parse_args([])
    train_config = TrainConfig(
        backend=args.backend,
        nprocs=args.nprocs,
        compute_setup=args.compute_setup,
        print_every=5,
        max_iter=50,
    )

    trainer = Trainer(model, optimizer, train_config, loss_fn="mse", optimize_step=optimize_step)
    trainer.fit(dataloader)
    return {"state": trainer_state(trainer), "full_loss": full_loss(model, x, y)}


if __name__ == "__main__":
    run(main)
