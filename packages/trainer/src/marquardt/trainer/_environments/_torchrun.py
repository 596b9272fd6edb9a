"""Launched by ``torchrun`` (torch.distributed.elastic): the launcher sets every rank.

torchrun exports ``TORCHELASTIC_RUN_ID``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in each worker;
the world size is the launcher's, so ``nprocs`` may be left at 1.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import _settings
from .._doclists import with_lists
from .._errors import LaunchError
from ._base import ENVIRONMENT_LISTS, LaunchEnvironment, ProcessLayout

_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@with_lists(ENVIRONMENT_LISTS)
class TorchrunEnvironment(LaunchEnvironment):
    """One process per worker of torchrun; ranks come from its variables."""

    name = "torchrun"

    @classmethod
    def detect(cls, env: Mapping[str, str], nprocs: int) -> bool:
        return _settings.get("TORCHELASTIC_RUN_ID", env) is not None

    def _int(self, name: str, default: int | None = None) -> int:
        value = _settings.get_int(name, self.env)
        if value is None:
            if default is None:
                raise LaunchError(
                    f"torchrun: {name} is not set although TORCHELASTIC_RUN_ID is. "
                    "HINT: launch with torchrun (or python -m torch.distributed.run), which "
                    "sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
                )
            return default
        return value

    def validate(self) -> None:
        missing = [n for n in _REQUIRED if _settings.get(n, self.env) is None]
        if missing:
            raise LaunchError(
                f"torchrun: TORCHELASTIC_RUN_ID is set but {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not. HINT: launch with torchrun (or "
                "python -m torch.distributed.run), which sets them all"
            )
        world = self.world_size
        if self.nprocs not in (1, world):
            raise LaunchError(
                f"torchrun: TrainConfig.nprocs={self.nprocs} but torchrun started "
                f"WORLD_SIZE={world} processes. HINT: leave nprocs at 1 under torchrun (the "
                f"launcher sets the world size), or set it to {world}"
            )
        rank = self._int("RANK")
        if not 0 <= rank < world:
            raise LaunchError(
                f"torchrun: RANK={rank} is outside 0..{world - 1} (WORLD_SIZE={world}). "
                "HINT: do not set RANK by hand under torchrun"
            )
        self._check_gpus()

    @property
    def world_size(self) -> int:
        return self._int("WORLD_SIZE")

    @property
    def local_processes(self) -> int:
        return self._int("LOCAL_WORLD_SIZE", default=self.world_size)

    def init_method(self, layout: ProcessLayout) -> str:
        """torchrun's workers meet through the variables it set (``env://``)."""
        return "env://"

    def layouts(self) -> list[ProcessLayout]:
        return [
            ProcessLayout(
                rank=self._int("RANK"),
                local_rank=self._int("LOCAL_RANK"),
                world_size=self.world_size,
                local_world_size=self.local_processes,
                node_rank=self._int("GROUP_RANK", default=0),
                master_addr=_settings.get("MASTER_ADDR", self.env) or "127.0.0.1",
                master_port=self._int("MASTER_PORT"),
            )
        ]
