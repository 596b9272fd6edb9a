"""The seeds' ``train.py`` made to converge and to say who ran, for the launcher tests.

Same data (y = sin 2πx on [0, 1]), model and command line as ``train.py`` (``--nprocs``,
``--compute_setup``, ``--backend``), so every launcher recipe runs it unchanged. It differs
where a test needs a property that could fail: Adam at a fixed seed for epochs 0 to
``--max_iter``, one step each (each rank's batch is the whole of its shard), so the loss
falls far; losses averaged over
the ranks (``all_reduce_metrics``); and every process prints one line
``fit-rank: rank R local_rank L world_size W host H cuda_visible_devices C`` when training
starts, so a test can check the layout the launcher produced.
"""

from __future__ import annotations

import torch
from _launched import ReportRank, command_line, sine_data, sine_model
from torch import optim
from torch.utils.data import DataLoader, TensorDataset

from marquardt.trainer import TrainConfig, Trainer
from marquardt.trainer.optimize_step import optimize_step

Trainer.set_use_grad(True)


def main() -> None:
    parser = command_line(60, "The last epoch (one optimizer step each).")
    parser.add_argument("--lr", type=float, default=0.02, help="Adam's learning rate.")
    args = parser.parse_args()

    torch.manual_seed(0)
    # One batch per rank per epoch: a rank's shard is at most 100 samples.
    dataloader = DataLoader(TensorDataset(*sine_data()), batch_size=100, shuffle=True)
    model = sine_model()
    optimizer = optim.Adam(model.parameters(), lr=args.lr)
    config = TrainConfig(
        backend=args.backend,
        nprocs=args.nprocs,
        compute_setup=args.compute_setup,
        print_every=10,
        max_iter=args.max_iter,
        all_reduce_metrics=True,
        seed=0,
        callbacks=[ReportRank()],
    )
    Trainer(model, optimizer, config, loss_fn="mse", optimize_step=optimize_step).fit(dataloader)


if __name__ == "__main__":
    main()
