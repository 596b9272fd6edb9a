"""A configurable training job for the multi-process tests.

Writes, from the calling process (the spawning parent, or rank 0 of a launcher), a JSON
file with the final full-data loss and the trained parameters of the model ``fit`` returned.
Faults are injected by callbacks: rank R SIGKILLs itself at global step S, or rank 0 sends
SIGTERM to the spawning parent (or to itself) at step S. ``--max-iter`` and the periods count
epochs. With ``--patience`` the run validates on the full data every ``--val-every`` epochs
and stops early (``EarlyStopping``); the JSON then holds the callback's best value and the
epoch it stopped at.
"""

import argparse
import functools
import json
import os
import signal
import sys

import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from marquardt.testing.lma import make_lma
from marquardt.testing.models import flat
from marquardt.trainer import Callback, EarlyStopping, TrainConfig, Trainer


class Fault(Callback):
    """At global step ``step`` on ``rank``: SIGKILL this process, or SIGTERM the launcher."""

    def __init__(self, kind, step, rank):
        super().__init__(on="train_batch_end")
        self.kind, self.step, self.rank = kind, step, rank

    def _should_call(self, when, opt_result):
        return True  # after every batch, epoch 0's too

    def run_callback(self, trainer, config, writer):
        if trainer.global_step != self.step or trainer.accelerator.rank != self.rank:
            return
        if self.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "sigterm-parent":
            os.kill(os.getppid(), signal.SIGTERM)
        elif self.kind == "sigterm-self":
            os.kill(os.getpid(), signal.SIGTERM)


def residual(outputs, targets, kill_rank=None, kill_call=None, calls=[0]):  # noqa: B006
    """r = outputs - targets; with ``kill_rank``, that rank SIGKILLs itself inside an LM step
    (at its ``kill_call``-th residual evaluation: Jacobian slices and trial forwards)."""
    if kill_rank is not None and torch.distributed.get_rank() == kill_rank:
        calls[0] += 1
        if calls[0] == kill_call:
            os.kill(os.getpid(), signal.SIGKILL)
    return outputs - targets


def write_params(trainer, config, writer):
    """Every rank writes its final parameters to params_<rank>.json (do the ranks agree?)."""
    params = flat(trainer.model).tolist()
    with open(f"params_{trainer.accelerator.rank}.json", "w") as handle:
        json.dump(params, handle)


def sinc_data(n):
    x = torch.linspace(-1, 1, n).unsqueeze(1)
    return x, torch.sinc(3 * x)


#: The job's numbers a test may set, by flag: their defaults (the type is the default's).
NUMBERS = {
    "--nprocs": 1,
    "--samples": 64,
    "--batch-size": 8,
    "--max-iter": 20,
    "--lr": 0.1,
    "--checkpoint-every": 0,
    "--fault-step": 0,
    "--fault-rank": 0,
    "--dist-timeout": 30.0,
    "--val-every": 0,
    "--patience": 0,
    "--min-delta": 0.0,
}


def main(argv=None):
    p = argparse.ArgumentParser()
    for flag, default in NUMBERS.items():
        p.add_argument(flag, type=type(default), default=default)
    p.add_argument("--loop", default="ddp", choices=["ddp", "lm"])
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--root", default="runs")
    p.add_argument("--resume", default=None)
    p.add_argument("--fault", default=None, choices=["sigkill", "sigterm-parent", "sigterm-self"])
    p.add_argument("--all-reduce", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--lm-factory", action="store_true", help="an LMA factory (always with nprocs > 1)"
    )
    p.add_argument("--kill-in-step", type=int, nargs=2, default=None, metavar=("RANK", "CALL"))
    p.add_argument("--rank-params", action="store_true")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    x, y = sinc_data(args.samples)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=args.shuffle)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))
    if args.loop == "lm" and (args.lm_factory or args.nprocs > 1):
        kill = args.kill_in_step or (None, None)
        # The LMA factory: built in each training process, in the process group if any.
        fn = functools.partial(residual, kill_rank=kill[0], kill_call=kill[1])
        optimizer = functools.partial(make_lma, residual_fn=fn)
    elif args.loop == "lm":
        from marquardt.solver import LMA

        optimizer = LMA(model, [torch.device("cpu")], residual_fn=lambda a, b: a - b)
    else:
        optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.5)
    callbacks = [Fault(args.fault, args.fault_step, args.fault_rank)] if args.fault else []
    if args.rank_params:
        callbacks.append(Callback(on="train_end", callback=write_params))
    stopper = None
    val_loader = None
    if args.patience:
        stopper = EarlyStopping(patience=args.patience, min_delta=args.min_delta)
        callbacks.append(stopper)
        val_loader = DataLoader(TensorDataset(x, y), batch_size=args.samples)
    config = TrainConfig(
        max_iter=args.max_iter,
        nprocs=args.nprocs,
        backend="gloo",
        compute_setup="cpu",
        log_folder=args.root,
        resume_from=args.resume,
        checkpoint_every=args.checkpoint_every,
        print_every=5,
        write_every=1,
        callbacks=callbacks,
        seed=0,
        dist_timeout=args.dist_timeout,
        all_reduce_metrics=args.all_reduce,
        val_every=args.val_every,
    )
    trainer = Trainer(model, optimizer, config, loss_fn="mse")
    model, _ = trainer.fit(loader, val_loader)
    if args.out and trainer.state.rank == 0:
        with torch.no_grad():
            loss = nn.functional.mse_loss(model(x), y).item()
        params = flat(model).tolist()
        with open(args.out, "w") as handle:
            result = {
                "loss": loss,
                "params": params,
                "step": trainer.global_step,
                "epoch": trainer.current_epoch,
            }
            if stopper is not None:
                result.update(best=stopper.best, stopped_at=stopper.stopped_at)
            json.dump(result, handle)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
