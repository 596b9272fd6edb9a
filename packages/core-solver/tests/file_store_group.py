"""How a two-process test script joins its gloo group: ``python SCRIPT RANK WORLD STORE OUT``."""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def join_file_store_group(timeout_s: float) -> tuple[int, str]:
    """Join the gloo group named on the command line through its file store, on one thread.

    **Arguments:**

    - ``timeout_s``: how long a collective waits for the other ranks, in seconds.

    **Returns:** this process's rank and the path its results go to (OUT).
    """
    rank, world, store_path, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    return rank, out
