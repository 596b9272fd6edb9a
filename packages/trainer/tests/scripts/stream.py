"""Train on a stream (an IterableDataset of items 0, 1, ..., N-1) and record what each rank saw.

Every rank writes ``seen_<rank>.json``: for each step, the epoch and the item numbers of its
batch. ``--self-sharding`` uses a dataset that splits itself (``set_shard``) unevenly: rank r
keeps the items i with i mod W == r among the first N / (r + 1) items, so rank 1 runs out of
batches long before rank 0.
"""

import argparse
import json
import sys

import torch
from tiny_run import tiny_trainer
from torch.utils.data import DataLoader, IterableDataset

from marquardt.trainer import Trainer


class Stream(IterableDataset):
    """Items (x = [i], y = [0]) for i = 0 .. items - 1."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        for i in range(self.items):
            yield torch.tensor([float(i)]), torch.zeros(1)


class UnevenSelfSharding(Stream):
    """Splits itself over ranks (set_shard), giving rank r the first items / (r + 1) only."""

    rank, world_size = 0, 1

    def set_shard(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def __iter__(self):
        end = self.items // (self.rank + 1)
        for i in range(self.rank, end, self.world_size):
            yield torch.tensor([float(i)]), torch.zeros(1)


class Recording(Trainer):
    """Every rank records the items of each of its training batches, with the epoch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def on_train_batch_start(self, batch):
        items = [int(v) for v in batch[0].reshape(-1).tolist()]
        self.seen.append([self.current_epoch, items])

    def on_train_end(self, train_losses, val_losses=None):
        with open(f"seen_{self.accelerator.rank}.json", "w") as handle:
            json.dump({"seen": self.seen, "step": self.global_step}, handle)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--items", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--max-iter", type=int, default=10)
    p.add_argument("--self-sharding", action="store_true")
    p.add_argument("--dist-timeout", type=float, default=20.0)
    args = p.parse_args(argv)

    dataset = (UnevenSelfSharding if args.self_sharding else Stream)(args.items)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    trainer = tiny_trainer(Recording, args.nprocs, args.max_iter, args.dist_timeout)
    trainer.fit(loader)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
