"""torch's intra-op thread count, set for a block and restored after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["torch_threads"]


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """``torch.set_num_threads(count)`` for the block; the count before it afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
