"""Launched by ``legate`` (or with ``LEGATE_CONFIG`` set): the LM loop's environment.

Legate distributes the solver's arrays itself; from the trainer's point of view there is
one training process, whose LM steps are data-parallel inside ``LMA``. A second layer of
processes (``nprocs > 1``) would start several Legate programs fighting over the GPUs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from .. import _settings
from .._doclists import with_lists
from .._errors import LaunchError
from ._base import ENVIRONMENT_LISTS, SingleProcess


@with_lists(ENVIRONMENT_LISTS)
class LegateEnvironment(SingleProcess):
    """One training process under the Legate runtime."""

    name = "legate"

    @classmethod
    def detect(cls, env: Mapping[str, str], nprocs: int) -> bool:
        return _settings.get("LEGATE_CONFIG", env) is not None or "legate.core" in sys.modules

    def validate(self) -> None:
        if self.nprocs != 1:
            raise LaunchError(
                f"legate: TrainConfig.nprocs={self.nprocs} but under Legate the trainer runs one "
                "process (Legate spreads the solver over its GPUs and nodes itself). HINT: set "
                "nprocs=1 and give Legate the GPUs (legate --gpus K), or run the DDP loop "
                "without legate (python train.py --nprocs N, or torchrun)"
            )
