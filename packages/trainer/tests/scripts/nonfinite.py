"""A run meeting a non-finite loss, for the fault tests; one process of a data-parallel run
(or the only one). Writes ``<out>-rank<r>.json``: how the run ended on this rank.

``--fault diverge``: SGD with a learning rate far too large (the loss overflows within a
few epochs). ``--fault poison``: sample 17 has an infinite target (in 2 processes only
rank 1 holds it), so one batch per epoch has an infinite loss. The run trains epochs
``0 … --epochs`` of ``--batches`` batches of 8 samples (4 per process in 2), one step per
batch, and writes a checkpoint after every epoch from epoch 1 on (perceptrain's counting).

``--loop lm``: the LM loop (an LMA per process, over the process group) fits exp(w·x) to
exp(2x) on [0, 1]; ``--fault poison`` then sets x of sample 17 to 2000, where exp(w·x)
overflows (finite data, an infinite residual: in 2 processes on rank 1 alone).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from marquardt.testing.lma import make_lma
from marquardt.testing.models import flat
from marquardt.trainer import NonFiniteLossError, TrainConfig, Trainer


def dataset(fault: str) -> TensorDataset:
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    y = 5 * torch.sin(3 * x)
    if fault == "poison":
        y[17] = float("inf")
    return TensorDataset(x, y)


class Exp(nn.Module):
    """exp(w·x), float64: finite on [0, 1], overflowing at x = 2000."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.w * x)


def lm_dataset(fault: str) -> TensorDataset:
    x = torch.linspace(0, 1, 64, dtype=torch.float64).unsqueeze(1)
    y = torch.exp(2.0 * x) + 1e-3 * torch.sin(50.0 * x)  # not fitted exactly by any batch
    if fault == "poison":
        x[17] = 2000.0
    return TensorDataset(x, y)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["diverge", "poison"], required=True)
    parser.add_argument("--policy", default="stop")
    parser.add_argument("--nprocs", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--out", required=True)
    parser.add_argument("--loop", choices=["ddp", "lm"], default="ddp")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    lm = args.loop == "lm"
    model = Exp() if lm else nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    lr = 3.0 if args.fault == "diverge" else 0.05
    config = TrainConfig(
        max_iter=args.epochs,
        nprocs=args.nprocs,
        backend="gloo",
        compute_setup="cpu",
        checkpoint_every=1,
        keep_checkpoints=3,
        on_nonfinite=args.policy,
        verbose=False,
        seed=0,
    )
    optimizer = make_lma if lm else torch.optim.SGD(model.parameters(), lr=lr)
    trainer = Trainer(model, optimizer, config, max_batches=args.batches)
    data = lm_dataset(args.fault) if lm else dataset(args.fault)
    outcome: dict[str, object] = {}
    try:
        trainer.fit(train_dataset=data, batch_size=8 // args.nprocs, shuffle=False)
        outcome["finished"] = trainer.state.step
        outcome["epochs"] = trainer.state.epoch
    except NonFiniteLossError as exc:
        outcome.update(error=str(exc), step=exc.step, epoch=exc.epoch, batch=exc.batch,
                       last_checkpoint=exc.last_checkpoint)  # fmt: skip
    params = flat(model)
    outcome["finite"] = bool(torch.isfinite(params).all())
    outcome["params"] = params.tolist()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    with open(f"{args.out}-rank{rank}.json", "w") as handle:
        json.dump(outcome, handle)


if __name__ == "__main__":
    main()
