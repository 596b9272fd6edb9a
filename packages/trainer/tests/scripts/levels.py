"""The three levels of data control, each in 2 spawned processes (gloo, CPU).

``--level 1``: a DataLoader; ``--level 2``: a dataset with loader settings; ``--level 3``:
a dataset factory, called inside each training process. Every rank writes
``levels_<rank>.json``: the items of every batch it trained on, its pid, and (level 3) the
pid and rank of the process where its dataset was built. The factory's dataset holds a
lock (which cannot be pickled) and only the items of one half of the data per rank would
be wasteful to build elsewhere: it builds the full dataset, read from the rank's own
process, and records where it ran.
"""

import argparse
import json
import os
import sys
import threading

import torch
from tiny_run import tiny_trainer
from torch.utils.data import DataLoader, Dataset, TensorDataset

from marquardt.trainer import Trainer

ITEMS = 48
#: Something a dataset factory closes over that pickle refuses (module-level, per process).
LOCK = threading.Lock()


def tensors():
    x = torch.arange(ITEMS, dtype=torch.float32).unsqueeze(1)
    return x, torch.zeros(ITEMS, 1)


class Locked(Dataset):
    """Items 0..ITEMS-1 behind a lock: pickling this dataset fails."""

    def __init__(self):
        self.lock = LOCK
        self.x, self.y = tensors()
        self.built_in = os.getpid()
        self.rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0

    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        with self.lock:
            return self.x[i], self.y[i]


BUILT = []


def make_dataset():
    dataset = Locked()
    BUILT.append({"pid": dataset.built_in, "rank": dataset.rank})
    return dataset


class Recording(Trainer):
    """Every rank records the items of each of its training batches."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def on_train_batch_start(self, batch):
        self.seen.append([int(v) for v in batch[0].reshape(-1).tolist()])

    def on_train_end(self, train_losses, val_losses=None):
        with open(f"levels_{self.accelerator.rank}.json", "w") as handle:
            json.dump({"seen": self.seen, "pid": os.getpid(), "built": BUILT}, handle)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--level", type=int, choices=[1, 2, 3], required=True)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args(argv)

    # max_iter=0: one epoch, 48 items, 2 ranks, batches of 4.
    trainer = tiny_trainer(Recording, args.nprocs, max_iter=0, dist_timeout=30)
    if args.level == 1:
        trainer.fit(DataLoader(TensorDataset(*tensors()), batch_size=4, shuffle=True))
    elif args.level == 2:
        trainer.fit(train_dataset=TensorDataset(*tensors()), batch_size=4, num_workers=args.workers)
    else:
        trainer.fit(train_dataset=make_dataset, batch_size=4, num_workers=args.workers)
    with open("parent.json", "w") as handle:
        json.dump({"pid": os.getpid(), "built": BUILT}, handle)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
