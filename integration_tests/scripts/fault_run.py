"""A training run for the fault tests: one that diverges, one to interrupt, one whose
folder fills up.

The seeds' command line (``--nprocs``, ``--compute_setup``, ``--backend``, ``--max_iter``),
so the launcher recipes run it unchanged, and the sine data of ``_launched``, with a
1-H-H-1 tanh network (``--hidden``) so that a checkpoint has the size a test needs. A
checkpoint every ``--checkpoint_every`` epochs, in the run's folder under
``--root_folder``; the epoch's loss printed every epoch. SGD with ``--lr 0.3`` on targets
scaled by ``--scale 10`` overflows within a few epochs; Adam (the default) converges. A ``NonFiniteLossError`` propagates after each process
prints ``fault-nonfinite: rank R step S epoch E batch B``; a finished run prints
``fault-finished: rank R epoch E finite F sum S`` (S: the sum of the parameters).
"""

from __future__ import annotations

import signal

import torch
from _launched import command_line, sine_data
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from marquardt.testing.models import flat
from marquardt.trainer import NonFiniteLossError, TrainConfig, Trainer
from marquardt.trainer.optimize_step import optimize_step

Trainer.set_use_grad(True)


def main() -> None:
    # Started from a shell's background job, this process inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler: this run exists to be interrupted.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = command_line(10000, "The last epoch.")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--scale", type=float, default=1.0, help="Targets times this.")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=10)
    parser.add_argument("--root_folder", default="runs")
    parser.add_argument("--checkpoint_every", type=int, default=1)
    parser.add_argument("--keep_checkpoints", type=int, default=3)
    parser.add_argument("--on_nonfinite", default="stop")
    parser.add_argument("--resume", action="store_true", help="resume_from='latest'")
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = sine_data()
    loader = DataLoader(TensorDataset(x, args.scale * y), batch_size=args.batch_size)
    h = args.hidden
    model = nn.Sequential(nn.Linear(1, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(), nn.Linear(h, 1))
    if args.optimizer == "sgd":
        optimizer: optim.Optimizer = optim.SGD(model.parameters(), lr=args.lr)
    else:
        optimizer = optim.Adam(model.parameters(), lr=args.lr)
    config = TrainConfig(
        backend=args.backend,
        nprocs=args.nprocs,
        compute_setup=args.compute_setup,
        max_iter=args.max_iter,
        print_every=1,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        root_folder=args.root_folder,
        on_nonfinite=args.on_nonfinite,
        resume_from="latest" if args.resume else None,
        seed=0,
    )
    trainer = Trainer(model, optimizer, config, loss_fn="mse", optimize_step=optimize_step)
    try:
        trainer.fit(loader)
    except NonFiniteLossError as exc:
        print(
            f"fault-nonfinite: rank {trainer.state.rank} step {exc.step} epoch {exc.epoch} "
            f"batch {exc.batch}",
            flush=True,
        )
        raise
    params = flat(model)
    print(
        f"fault-finished: rank {trainer.state.rank} epoch {trainer.current_epoch} "
        f"finite {bool(torch.isfinite(params).all())} sum {float(params.sum())!r}",
        flush=True,
    )


if __name__ == "__main__":
    main()
