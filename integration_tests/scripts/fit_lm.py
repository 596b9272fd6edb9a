"""The LM loop under the launchers: the seeds' command line, an LMA built in each process.

Same command line as ``train.py`` (``--nprocs``, ``--compute_setup``, ``--backend``), so
every launcher recipe runs it. Each process builds its ``LMA`` with the factory
``make_lma(model, process_group)`` after the rendezvous, takes its share of each global
batch, and prints ``fit-rank: ...`` when training starts (as ``fit.py`` does) and
``lm-params: rank R sum S norm N`` at the end, so a test can check that the ranks agree.
"""

from __future__ import annotations

import torch
from _launched import ReportRank, command_line, sine_data, sine_model
from torch.utils.data import DataLoader, TensorDataset

from marquardt.testing.lma import make_lma
from marquardt.testing.models import flat
from marquardt.trainer import Callback, TrainConfig, Trainer


class ReportParams(Callback):
    """This process's final parameters (at the end)."""

    def __init__(self) -> None:
        super().__init__(on="train_end")

    def run_callback(self, trainer: Trainer, config: object, writer: object) -> None:
        params = flat(trainer.model)
        print(
            f"lm-params: rank {trainer.state.rank} sum {float(params.sum())!r} "
            f"norm {float(params.norm())!r}",
            flush=True,
        )


def main() -> None:
    args = command_line(20, "The last epoch (two LM steps each).").parse_args()

    torch.manual_seed(0)
    # Global batches of 50 (25 per rank with 2 ranks): two steps an epoch.
    per_rank = max(1, 50 // max(args.nprocs, 1))
    dataloader = DataLoader(TensorDataset(*sine_data()), batch_size=per_rank, shuffle=True)
    model = sine_model()
    config = TrainConfig(
        backend=args.backend,
        nprocs=args.nprocs,
        compute_setup=args.compute_setup,
        print_every=10,
        max_iter=args.max_iter,
        seed=0,
        callbacks=[ReportRank(), ReportParams()],
    )
    Trainer(model, make_lma, config, loss_fn="mse").fit(dataloader)


if __name__ == "__main__":
    main()
