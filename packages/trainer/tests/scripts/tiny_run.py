"""The trainer the data-control scripts spawn: a 1-1 linear model that barely moves, over
``nprocs`` CPU processes on gloo, writing only its run folder."""

import torch
from torch import nn, optim

from marquardt.trainer import TrainConfig


def tiny_trainer(trainer_class, nprocs, max_iter, dist_timeout):
    """A ``trainer_class`` (a Trainer) of a seeded ``nn.Linear(1, 1)`` under SGD at lr 1e-6.

    **Arguments:**

    - ``trainer_class``: the Trainer subclass that records what its ranks see.
    - ``nprocs``: the training processes to spawn.
    - ``max_iter``: the epochs to train (0: one epoch).
    - ``dist_timeout``: seconds a collective waits for the other ranks.

    **Returns:** the trainer, not yet fitted.
    """
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    config = TrainConfig(
        max_iter=max_iter,
        nprocs=nprocs,
        backend="gloo",
        compute_setup="cpu",
        root_folder="runs",
        print_every=0,
        write_every=0,
        seed=0,
        dist_timeout=dist_timeout,
    )
    return trainer_class(model, optim.SGD(model.parameters(), lr=1e-6), config, loss_fn="mse")
