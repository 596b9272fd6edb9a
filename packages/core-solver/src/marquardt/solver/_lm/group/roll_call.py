"""Which ranks are still alive after a collective failed: `roll_call`.

A failed collective says that some peer did not take part, not which one. Every rank that
saw the failure writes its name under a key of the step into the rendezvous store and
reads the others' for ``ROLL_CALL_SECONDS``; the ranks whose key never appears are named
in the error (`RankFailureError`). The store may have died with a rank (rank 0 serves it
with ``init_method`` tcp:// or env://): then nobody can be named, and the error says so.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist

__all__ = ["ROLL_CALL_SECONDS", "roll_call"]

#: Seconds a failing rank waits for the others' answers to its roll call.
ROLL_CALL_SECONDS = 2.0


def roll_call(rank: int, world_size: int, step: int) -> str:
    """Which ranks answer through the rendezvous store within ``ROLL_CALL_SECONDS``.

    Arguments:
        rank: this rank in its group.
        world_size: how many ranks the group has.
        step: the LM steps finished so far (the roll call's keys are per step).

    Returns:
        A clause for the error message: who did not answer, or why nobody can be named.
    """
    try:
        store = dist.distributed_c10d._get_default_store()
        previous = store.timeout  # type: ignore[attr-defined]
        store.set_timeout(timedelta(seconds=ROLL_CALL_SECONDS))
        prefix = f"marquardt/lma/roll-call/{step}/"
        try:
            store.set(f"{prefix}{rank}", "alive")
            deadline = time.monotonic() + ROLL_CALL_SECONDS
            missing = list(range(world_size))
            while missing and time.monotonic() < deadline:
                missing = [r for r in missing if not store.check([f"{prefix}{r}"])]
                if missing:
                    time.sleep(0.1)
        finally:
            store.set_timeout(previous)
    except Exception as err:  # the store may have died with a rank
        return (
            "the rendezvous store did not answer either, so the rank that died is "
            f"unknown (it may have served the store, as rank 0 does with init_method "
            f"tcp:// or env://): {type(err).__name__}"
        )
    if not missing:
        return "every rank answered the roll call afterwards"
    names = ", ".join(str(r) for r in missing)
    return f"rank(s) {names} did not answer a roll call within {ROLL_CALL_SECONDS:g} s"
