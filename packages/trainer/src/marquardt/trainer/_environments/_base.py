"""What every launch environment provides: detection, validation and the process layout.

A launch environment answers three questions before any rendezvous, so that the classic
mistakes fail with a message instead of a hang: *is this the launcher that started me*
(``detect``), *does the configuration fit what it started* (``validate``), and *which
processes take part, with which ranks* (``layouts``). Environments read a plain mapping
of environment variables (see ``marquardt.trainer._settings``), so they are tested from
dictionaries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from .._doclists import with_lists
from .._errors import LaunchError


@dataclass(frozen=True)
class ProcessLayout:
    """Where one training process sits: its ranks and the rendezvous address.

    Arguments:
        rank: the global rank (what ``DistributedSampler`` must get).
        local_rank: the rank on its node (what picks its GPU).
        world_size: the number of training processes of the run.
        local_world_size: the number of training processes on its node.
        node_rank: the index of its node.
        master_addr: the host of the rendezvous.
        master_port: the port of the rendezvous.
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int


#: The arguments every launch environment is built with, added to each one's docstring.
ENVIRONMENT_LISTS = """
Arguments:
    env: the environment variables (read, not changed; copied).
    nprocs: ``TrainConfig.nprocs``, the training processes asked for.
    gpu_count: GPUs visible to this process.
    use_gpu: whether the run trains on GPUs (the resolved ``compute_setup``).
"""


@with_lists(ENVIRONMENT_LISTS)
class LaunchEnvironment(ABC):
    """Base class of the launch environments.

    Constructing one checks nothing; ``validate`` does, before any rendezvous.
    """

    name: ClassVar[str] = "base"
    #: True when this process starts the training processes itself (spawn).
    spawns: ClassVar[bool] = False
    #: True when the environment may bind one GPU per task (CUDA_VISIBLE_DEVICES per task),
    #: so seeing fewer GPUs than local processes is not an error.
    per_task_gpu_binding: ClassVar[bool] = False

    def __init__(
        self, env: Mapping[str, str], nprocs: int, gpu_count: int = 0, use_gpu: bool = False
    ) -> None:
        self.env = dict(env)
        self.nprocs = nprocs
        self.gpu_count = gpu_count
        self.use_gpu = use_gpu

    @classmethod
    @abstractmethod
    def detect(cls, env: Mapping[str, str], nprocs: int) -> bool:
        """Whether this environment launched the current process."""

    @abstractmethod
    def validate(self) -> None:
        """Raise [`LaunchError`][marquardt.trainer.LaunchError] if the configuration does not fit the launch."""

    @abstractmethod
    def layouts(self) -> list[ProcessLayout]:
        """The layout of this process, or of each process to spawn when ``spawns``."""

    @property
    def world_size(self) -> int:
        """The number of training processes of the whole run: ``nprocs`` unless the launcher
        fixed it."""
        return self.nprocs

    @property
    def local_processes(self) -> int:
        """How many training processes run on this node."""
        return 1

    def init_method(self, layout: ProcessLayout) -> str:
        """Where the processes of ``layout`` meet (torch.distributed's ``init_method``)."""
        return f"tcp://{layout.master_addr}:{layout.master_port}"

    def describe(self) -> str:
        """One line for the start-up notice."""
        return f"{self.name}: world size {self.world_size}"

    def device_index(self, layout: ProcessLayout) -> int:
        """The CUDA ordinal for ``layout`` (only meaningful when ``use_gpu``)."""
        if self.gpu_count >= layout.local_world_size:
            return layout.local_rank
        # One GPU bound per task (srun --gpus-per-task=1): every process sees its own as 0.
        return layout.local_rank % max(self.gpu_count, 1)

    def _check_gpus(self) -> None:
        """More local processes than visible GPUs would put two ranks on one GPU."""
        if not self.use_gpu:
            return
        local = self.local_processes
        if local <= self.gpu_count:
            return
        if self.per_task_gpu_binding and self.gpu_count >= 1:
            return
        raise LaunchError(
            f"{self.name}: {local} training processes on this node but only {self.gpu_count} "
            f"GPU{'' if self.gpu_count == 1 else 's'} visible; two processes would share a GPU "
            "(NCCL refuses that). HINT: lower nprocs (or --nproc_per_node) to the GPUs per "
            "node, expose more GPUs through CUDA_VISIBLE_DEVICES, or train on CPUs with "
            "compute_setup='cpu' and backend='gloo'"
        )


class SingleProcess(LaunchEnvironment):
    """An environment of one training process: rank 0 of 1, no process group."""

    @property
    def world_size(self) -> int:
        return 1

    def layouts(self) -> list[ProcessLayout]:
        return [ProcessLayout(0, 0, 1, 1, 0, "127.0.0.1", 0)]
