"""A process that a spawn started: its layout was decided by the spawning parent.

Never detected from variables: the spawned process's entry point builds its ``Trainer``
with this environment, which names the launcher that spawned it (``spawn``, or the
spawning Slurm layout) and holds the layout the parent gave it. The parent validated the
launch, so there is nothing left to check here.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._base import LaunchEnvironment, ProcessLayout


class SpawnedProcess(LaunchEnvironment):
    """One spawned training process with a given layout."""

    def __init__(self, layout: ProcessLayout, launcher: str, gpu_count: int, use_gpu: bool) -> None:
        # The layout's world size is ``nprocs``, which the base class's ``world_size`` answers.
        super().__init__({}, layout.world_size, gpu_count, use_gpu)
        self.layout = layout
        self.name = launcher  # type: ignore[misc]

    @classmethod
    def detect(cls, env: Mapping[str, str], nprocs: int) -> bool:
        return False

    def validate(self) -> None:
        """The spawning parent validated the launch."""

    @property
    def local_processes(self) -> int:
        return self.layout.local_world_size

    def layouts(self) -> list[ProcessLayout]:
        return [self.layout]

    def device_index(self, layout: ProcessLayout) -> int:
        return layout.local_rank % max(self.gpu_count, 1)
