"""The result a spawned run hands back: rank 0's trained state, written for the spawning parent.

Rank 0 writes the trained model, its loop's optimizer entries (``Loop.state_dict``), the
scheduler's state, its callbacks' states and the final step to a file (atomically), which
the parent loads into the caller's own model, loop (``Loop.load_state_dict``), scheduler
and callbacks (so ``EarlyStopping.best`` reads the same in the caller as in the run);
every rank holds the same weights, so rank 0's are the run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._callbacks._base import Callback
from .._loops._base import Loop
from .._loops._context import RunContext
from .._state import TrainerState
from . import _callback_state as callback_state
from . import _files as ckpt


def write_result(context: RunContext, path: str) -> None:
    """Rank 0 of a spawn: the trained state, for the parent."""
    state = context.state
    ckpt.atomic_save(
        {
            "model": ckpt.bare_state_dict(context.model),
            **context.loop.state_dict(),
            "scheduler": context.schedule.state_dict(),
            "step": state.step,
            "interrupted": state.interrupted,
            "stop_reason": state.stop_reason,
            callback_state.ENTRY: [callback_state.capture(context.callbacks)],
            "opt_result": _summary(context),
        },
        path,
    )


def _summary(context: RunContext) -> dict[str, Any] | None:
    """The final ``opt_result`` as plain numbers (the parent rebuilds it around its model)."""
    result = getattr(context.owner, "opt_result", None)
    if result is None:
        return None
    return {
        "iteration": int(result.iteration),
        "loss": None if result.loss is None else float(result.loss),
        "metrics": {str(k): float(v) for k, v in result.metrics.items()},
    }


def read_result(path: str) -> dict[str, Any]:
    """In the parent: what rank 0 wrote with ``write_result``."""
    result: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return result


def apply_result(
    result: dict[str, Any],
    loop: Loop,
    scheduler: Any,
    callbacks: Sequence[Callback],
    state: TrainerState,
) -> None:
    """In the parent: the caller's model, optimizer (through its loop), scheduler,
    callbacks and state get rank 0's trained state."""
    loop.model.load_state_dict(result["model"])
    loop.load_state_dict(result)
    if scheduler is not None and result.get("scheduler") is not None:
        scheduler.load_state_dict(result["scheduler"])
    state.step = int(result["step"])
    state.stop_reason = str(result.get("stop_reason", ""))
    state.interrupted = bool(result["interrupted"])
    callback_state.restore(result, callbacks, rank=0, world_size=1)
