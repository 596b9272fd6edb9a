"""Write checkpoint 1, then start checkpoint 2 and freeze half-way through the write.

The test kills this process with SIGKILL while it is frozen: checkpoint 1 must stay whole.
"""

import sys
import time
from pathlib import Path

import torch

from marquardt.trainer._persistence import _files as ckpt


def payload(step):
    return {
        "format": ckpt.FORMAT,
        "version": ckpt.VERSION,
        "kind": "ddp",
        "step": step,
        "model": {"w": torch.full((1000,), float(step))},
    }


def freeze(tmp: Path) -> None:
    size = tmp.stat().st_size
    with open(tmp, "r+b") as handle:  # leave a partially written file behind
        handle.truncate(size // 2)
    Path(sys.argv[2]).write_text(str(tmp))
    time.sleep(120)


if __name__ == "__main__":
    folder = Path(sys.argv[1]) / ckpt.CHECKPOINT_DIR
    ckpt.atomic_save(payload(1), folder / ckpt.checkpoint_name(1))
    ckpt._before_rename = freeze
    ckpt.atomic_save(payload(2), folder / ckpt.checkpoint_name(2))
