"""The threads of one rank's process, by ``marquardt.devices``' rule, when an LM step is
shared over a process group on CPUs.

Each rank computes its rows' Jacobian with torch's intra-op threads; ranks that each keep
torch's default (every core) oversubscribe the node. The rule divides the cores this
process may use by the ranks of the group on this host (one all-gather of host names, once
per ``LMA``, on every rank). ``OMP_NUM_THREADS``, a count the user set with
``torch.set_num_threads``, and a count already applied in this process (the ``Trainer``'s)
win.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import torch.distributed as dist

from marquardt.devices import ThreadChoice, applied_threads, apply_threads, choose_threads

_log = logging.getLogger("marquardt.solver")


def _ranks_on_this_host(group: Any) -> int:
    """The ranks of ``group`` whose host name is this process's (one all-gather)."""
    here = socket.gethostname()
    names: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(names, here, group=group)
    return max(1, sum(1 for name in names if name == here))


def share_threads(group: Any) -> ThreadChoice:
    """Apply the thread rule to this rank's process (collective: every rank calls it).

    Arguments:
        group: the process group (``None``: the default group).

    Returns:
        The `ThreadChoice` in force; rank 0 logs it once (logger ``marquardt.solver``).
    """
    ranks = _ranks_on_this_host(group)  # on every rank, whatever wins below
    kept = applied_threads()
    choice = kept if kept is not None else choose_threads(ranks, None, "ranks on this host")
    if kept is None:
        apply_threads(choice)
        if dist.get_rank(group) == 0:
            _log.info("LMA over a process group: %s", choice.describe())
    return choice
