"""A short 2-process spawn whose ranks each write the torch thread count they train with.

``python threads.py OUT [--threads-per-process N] [--user-threads N]``: every rank writes
``OUT/threads_<rank>.json`` at its first training batch; ``--user-threads`` calls
``torch.set_num_threads`` in the spawning parent before ``fit``.
"""

import argparse
import json
import os

import torch
from torch import nn, optim

from marquardt.trainer import Callback, TrainConfig, Trainer


class RecordThreads(Callback):
    """At the first training batch of each rank: its torch thread count, to a file."""

    def __init__(self, folder):
        super().__init__(on="train_batch_end")
        self.folder = folder

    def _should_call(self, when, opt_result):
        return True

    def run_callback(self, trainer, config, writer):
        rank = trainer.accelerator.rank
        path = os.path.join(self.folder, f"threads_{rank}.json")
        if not os.path.exists(path):
            with open(path, "w") as handle:
                json.dump({"threads": torch.get_num_threads()}, handle)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--threads-per-process", type=int, default=None)
    parser.add_argument("--user-threads", type=int, default=None)
    args = parser.parse_args()
    if args.user_threads is not None:
        torch.set_num_threads(args.user_threads)
    torch.manual_seed(0)
    x = torch.linspace(0, 1, 16).reshape(-1, 1)
    y = torch.sin(x)
    model = nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1))
    config = TrainConfig(
        nprocs=2,
        backend="gloo",
        compute_setup="cpu",
        max_iter=1,
        batch_size=8,
        root_folder=os.path.join(args.out, "runs"),
        tracking_tool="csv",
        threads_per_process=args.threads_per_process,
        callbacks=[RecordThreads(args.out)],
    )
    Trainer(model, optim.SGD(model.parameters(), lr=0.1), config, loss_fn="mse").fit(
        train_dataloader=(x, y)
    )


if __name__ == "__main__":
    main()
