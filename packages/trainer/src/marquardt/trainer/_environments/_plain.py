"""One process, no launcher: ``python train.py`` with ``nprocs=1``."""

from __future__ import annotations

from collections.abc import Mapping

from .._doclists import with_lists
from .._errors import LaunchError
from ._base import ENVIRONMENT_LISTS, SingleProcess


@with_lists(ENVIRONMENT_LISTS)
class PlainEnvironment(SingleProcess):
    """A single process; no process group is created."""

    name = "plain"

    @classmethod
    def detect(cls, env: Mapping[str, str], nprocs: int) -> bool:
        return nprocs == 1

    def validate(self) -> None:
        if self.nprocs != 1:
            raise LaunchError(
                f"plain: nprocs={self.nprocs} but no launcher started this process and only one "
                "runs. HINT: this should not happen; nprocs > 1 selects the spawn environment"
            )
        self._check_gpus()
