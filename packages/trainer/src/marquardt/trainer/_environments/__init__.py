"""Launch environments: which launcher started this process, and with which layout.

Detection order matters: torchrun first (it may itself run under srun), then Legate
(its multi-node launcher also sets SLURM_* variables), then srun, then a spawn
(``nprocs > 1`` without a launcher), then a plain single process.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._base import LaunchEnvironment, ProcessLayout
from ._hostlist import expand_hostlist, expand_tasks_per_node
from ._legate import LegateEnvironment
from ._plain import PlainEnvironment
from ._slurm import SlurmTaskPerNode, SlurmTaskPerProcess, port_from_job_id
from ._spawn import SpawnEnvironment, free_port
from ._spawned import SpawnedProcess
from ._torchrun import TorchrunEnvironment

ENVIRONMENTS: tuple[type[LaunchEnvironment], ...] = (
    TorchrunEnvironment,
    LegateEnvironment,
    SlurmTaskPerNode,
    SlurmTaskPerProcess,
    SpawnEnvironment,
    PlainEnvironment,
)


def detect_environment(
    env: Mapping[str, str], nprocs: int, gpu_count: int = 0, use_gpu: bool = False
) -> LaunchEnvironment:
    """The environment that launched this process (not yet validated).

    The first of torchrun, Legate, srun (one task per node, then one per process), spawn
    and plain whose ``detect`` answers yes; plain otherwise.

    Arguments:
        env: the environment variables (read, not changed; copied).
        nprocs: ``TrainConfig.nprocs``, the training processes asked for.
        gpu_count: GPUs visible to this process.
        use_gpu: whether the run trains on GPUs (the resolved ``compute_setup``).

    Returns:
        The environment, built with these arguments.
    """
    for cls in ENVIRONMENTS:
        if cls.detect(env, nprocs):
            return cls(env, nprocs, gpu_count, use_gpu)
    return PlainEnvironment(env, nprocs, gpu_count, use_gpu)


__all__ = [
    "ENVIRONMENTS",
    "LaunchEnvironment",
    "LegateEnvironment",
    "PlainEnvironment",
    "ProcessLayout",
    "SlurmTaskPerNode",
    "SlurmTaskPerProcess",
    "SpawnEnvironment",
    "SpawnedProcess",
    "TorchrunEnvironment",
    "detect_environment",
    "expand_hostlist",
    "expand_tasks_per_node",
    "free_port",
    "port_from_job_id",
]
