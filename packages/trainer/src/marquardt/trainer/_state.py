"""``TrainerState``: where a run is (step, epoch, rank, device, metrics), for callbacks.

The loop updates it after every step; callbacks read it as ``trainer.state``. Its
position fields (``step``, ``epoch``, ``batch_in_epoch``) are what a checkpoint stores, so
a resumed run continues at the same batch of the same epoch (once an epoch's batches are
done, ``epoch`` already names the next one); ``current_epoch`` is the epoch the run is in
(or ended last), which ``OptimizeResult.iteration`` reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class TrainerState:
    """Where the run is; read by callbacks (``trainer.state``).

    Arguments:
        step: optimizer steps taken.
        epoch: the epoch of the next batch (a checkpoint's position).
        batch_in_epoch: batches of ``epoch`` already taken.
        current_epoch: the epoch the run is in (or ended last).
        rank: the global rank of this process.
        local_rank: the rank on its node.
        world_size: the number of training processes.
        device: the device this process trains on.
        should_stop: a stop was asked for (by a callback or another rank).
        stop_reason: why the run stopped, in words (``""``: it did not stop early).
        interrupted: the run was stopped by a signal (SIGTERM).
        checkpoint_requested: set (with ``should_stop``) by a callback whose stop must
            leave a checkpoint.
        metrics: the last step's loss and metrics.
        val_metrics: the last validation's metrics.
        best_val: the best validation loss so far (``None``: none yet).
        log_folder: the run folder.
        started_at: ``time.monotonic()`` when this invocation of ``fit`` started training.
        last_checkpoint: the last checkpoint file written or loaded.
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    current_epoch: int = 0
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    should_stop: bool = False
    stop_reason: str = ""
    interrupted: bool = False
    #: Set (with ``should_stop``) by a callback whose stop must leave a checkpoint.
    checkpoint_requested: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    val_metrics: dict[str, float] = field(default_factory=dict)
    best_val: float | None = None
    log_folder: Path | None = None
    #: ``time.monotonic()`` when this invocation of ``fit`` started training.
    started_at: float | None = None
    last_checkpoint: Path | None = None

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0
