"""What the launcher test scripts share: the seeds' command line, data and model, and the
line every process prints when training starts.

The command line is ``train.py``'s (``--nprocs``, ``--compute_setup``, ``--backend``) plus
``--max_iter``, so every launcher recipe runs the scripts unchanged; the data are
y = sin 2πx on 100 points of [0, 1], the model a 1-16-1 tanh network. The scripts run by
path, so this module is found beside them (also by spawned and launched processes, which
start from the same path).
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
from torch import nn

from marquardt.trainer import Callback, Trainer


def command_line(max_iter: int, steps: str) -> argparse.ArgumentParser:
    """The seeds' arguments, and ``--max_iter`` (default ``max_iter``, help ``steps``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--nprocs", type=int, default=1, help="Number of processes.")
    parser.add_argument("--compute_setup", default="auto", choices=["cpu", "gpu", "auto"])
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo", "mpi"])
    parser.add_argument("--max_iter", type=int, default=max_iter, help=steps)
    return parser


def sine_data() -> tuple[torch.Tensor, torch.Tensor]:
    """x (100 × 1) on [0, 1] and y = sin 2πx."""
    x = torch.linspace(0, 1, 100).reshape(-1, 1)
    return x, torch.sin(2 * torch.pi * x)


def sine_model() -> nn.Module:
    """The 1-16-1 tanh network both scripts train (seed it first)."""
    return nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))


class ReportRank(Callback):
    """Print where this process sits in the run (every process, once):
    ``fit-rank: rank R local_rank L world_size W host H cuda_visible_devices C``."""

    def __init__(self) -> None:
        super().__init__(on="train_start")

    def run_callback(self, trainer: Trainer, config: object, writer: object) -> None:
        state = trainer.state
        print(
            f"fit-rank: rank {state.rank} local_rank {state.local_rank} "
            f"world_size {state.world_size} host {socket.gethostname()} "
            f"cuda_visible_devices {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}",
            flush=True,
        )
