"""What every rank of a group must start from, taken from the group's rank 0.

* θ, as DDP does when it wraps a model (`broadcast_parameters`);
* the seed random parameter subsets are drawn from (`common_seed`), so that every rank
  selects the same columns.
"""

from __future__ import annotations

import torch

from marquardt.jacobian import Replicas

from .collectives import Collectives

__all__ = ["broadcast_parameters", "common_seed"]


def broadcast_parameters(collectives: Collectives, replicas: Replicas) -> None:
    """θ of the group's rank 0 into ``replicas`` on every rank."""
    flat = replicas.flat_params().to(collectives.device)
    collectives.broadcast_(flat, "broadcast of the parameters")
    replicas.set_flat_params(flat)


def common_seed(collectives: Collectives, seed: int | None) -> int:
    """Rank 0's ``seed`` on every rank (drawn there when None)."""
    if seed is None and collectives.rank == 0:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    value = torch.tensor(
        [0 if seed is None else seed], dtype=torch.int64, device=collectives.device
    )
    collectives.broadcast_(value, "broadcast of the subset seed")
    return int(value.item())
