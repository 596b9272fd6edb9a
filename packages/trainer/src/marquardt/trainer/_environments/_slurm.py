"""Launched by Slurm's ``srun``, in the two layouts the seeds use.

*One task per process* (``srun --ntasks 4 python train.py --nprocs 4``): each task is one
training process; its global rank is ``SLURM_PROCID`` and its rank on the node
``SLURM_LOCALID``.

*One task per node* (``srun --ntasks 2 python train.py --nprocs 4``): each task spawns
``nprocs / ntasks`` processes; child ``i`` of task ``p`` has global rank
``p · k + i`` (``k = nprocs / ntasks``) and local rank ``SLURM_LOCALID · k + i``.

Both meet at the first host of the step's node list (where task 0 runs) on a port
derived from the job id, so every task computes the same address without talking to the
others; ``MASTER_ADDR`` / ``MASTER_PORT``, if set, win.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping

from .. import _settings
from .._doclists import with_lists
from .._errors import LaunchError
from ._base import ENVIRONMENT_LISTS, LaunchEnvironment, ProcessLayout
from ._hostlist import expand_hostlist, expand_tasks_per_node

#: Ports derived from job ids fall in [PORT_BASE, PORT_BASE + PORT_SPAN).
PORT_BASE = 15000
PORT_SPAN = 20000


def port_from_job_id(job_id: str | None) -> int:
    """The rendezvous port of a job: ``15000 + job_id mod 20000`` (29500 without a job id)."""
    if job_id is None:
        return 29500
    digits = "".join(ch for ch in job_id if ch.isdigit())
    if not digits:
        return 29500
    return PORT_BASE + int(digits) % PORT_SPAN


class _SlurmBase(LaunchEnvironment):
    """What both srun layouts read from Slurm: task counts, ranks, the rendezvous address."""

    @classmethod
    def _ntasks(cls, env: Mapping[str, str]) -> int | None:
        step = _settings.get_int("SLURM_STEP_NUM_TASKS", env)
        return step if step is not None else _settings.get_int("SLURM_NTASKS", env)

    @classmethod
    def _under_srun(cls, env: Mapping[str, str]) -> bool:
        return _settings.get("SLURM_PROCID", env) is not None and cls._ntasks(env) is not None

    @classmethod
    def _tasks_spawn(cls, env: Mapping[str, str], nprocs: int) -> bool:
        """``nprocs`` is a multiple (> 1) of the tasks: each task spawns its share."""
        ntasks = cls._ntasks(env) or 1
        return nprocs > ntasks and nprocs % ntasks == 0

    @classmethod
    def detect(cls, env: Mapping[str, str], nprocs: int) -> bool:
        # Anything that is not a clean multiple lands in one task per process, where
        # validate() explains it.
        return cls._under_srun(env) and cls._tasks_spawn(env, nprocs) == cls.spawns

    @property
    def ntasks(self) -> int:
        value = self._ntasks(self.env)
        if value is None:
            raise LaunchError(
                "slurm: SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is. "
                "HINT: launch the script with srun inside an allocation"
            )
        return value

    @property
    def procid(self) -> int:
        return _settings.get_int("SLURM_PROCID", self.env) or 0

    @property
    def localid(self) -> int:
        return _settings.get_int("SLURM_LOCALID", self.env) or 0

    @property
    def nodeid(self) -> int:
        return _settings.get_int("SLURM_NODEID", self.env) or 0

    @property
    def nnodes(self) -> int:
        step = _settings.get_int("SLURM_STEP_NUM_NODES", self.env)
        job = _settings.get_int("SLURM_NNODES", self.env)
        return step or job or 1

    @property
    def tasks_on_this_node(self) -> int:
        text = _settings.get("SLURM_STEP_TASKS_PER_NODE", self.env)
        if text is not None:
            counts = expand_tasks_per_node(text)
            if 0 <= self.nodeid < len(counts):
                return counts[self.nodeid]
        return max(1, -(-self.ntasks // self.nnodes))

    @property
    def master_addr(self) -> str:
        explicit = _settings.get("MASTER_ADDR", self.env)
        if explicit is not None:
            return explicit
        nodelist = _settings.get("SLURM_STEP_NODELIST", self.env) or _settings.get(
            "SLURM_JOB_NODELIST", self.env
        )
        if nodelist is None:
            return "127.0.0.1"
        hosts = expand_hostlist(nodelist)
        return hosts[0] if hosts else "127.0.0.1"

    @property
    def master_port(self) -> int:
        explicit = _settings.get_int("MASTER_PORT", self.env)
        if explicit is not None:
            return explicit
        return port_from_job_id(_settings.get("SLURM_JOB_ID", self.env))

    @property
    def per_task(self) -> int:
        """How many training processes each srun task runs."""
        return 1

    @property
    def local_processes(self) -> int:
        return self.tasks_on_this_node * self.per_task

    def layouts(self) -> list[ProcessLayout]:
        """This task's ``k = per_task`` processes: global rank ``p·k + i``, local ``l·k + i``."""
        k = self.per_task
        return [
            ProcessLayout(
                rank=self.procid * k + i,
                local_rank=self.localid * k + i,
                world_size=self.world_size,
                local_world_size=self.local_processes,
                node_rank=self.nodeid,
                master_addr=self.master_addr,
                master_port=self.master_port,
            )
            for i in range(k)
        ]

    def validate(self) -> None:
        self._check_common()
        if not self._tasks_fit():
            raise self._mismatch()
        self._check_gpus()

    @abstractmethod
    def _tasks_fit(self) -> bool:
        """Whether ``nprocs`` processes fit the tasks srun started."""

    def _check_common(self) -> None:
        ntasks = self.ntasks
        if not 0 <= self.procid < ntasks:
            raise LaunchError(
                f"slurm: SLURM_PROCID={self.procid} is outside 0..{ntasks - 1} "
                f"({ntasks} tasks). HINT: do not set SLURM_* variables by hand"
            )
        nodelist = _settings.get("SLURM_STEP_NODELIST", self.env) or _settings.get(
            "SLURM_JOB_NODELIST", self.env
        )
        if nodelist is not None:
            try:
                expand_hostlist(nodelist)
            except ValueError as exc:
                raise LaunchError(
                    f"slurm: cannot read the node list {nodelist!r}: {exc}. HINT: set "
                    "MASTER_ADDR to the first node's host name"
                ) from None

    def _mismatch(self) -> LaunchError:
        ntasks = self.ntasks
        return LaunchError(
            f"slurm: TrainConfig.nprocs={self.nprocs} but srun started {ntasks} task"
            f"{'' if ntasks == 1 else 's'}; nprocs (the world size) must equal the number of "
            f"tasks (one task per process) or a multiple of it (each task spawns nprocs/ntasks "
            f"processes). HINT: run srun --ntasks {self.nprocs} python train.py --nprocs "
            f"{self.nprocs}, or keep {ntasks} task{'' if ntasks == 1 else 's'} and pass "
            f"--nprocs {ntasks * max(1, self.nprocs // ntasks)}"
        )


@with_lists(ENVIRONMENT_LISTS)
class SlurmTaskPerProcess(_SlurmBase):
    """srun started every training process: one task per process."""

    name = "slurm (one task per process)"
    per_task_gpu_binding = True

    def _tasks_fit(self) -> bool:
        return self.nprocs == self.ntasks

    @property
    def world_size(self) -> int:
        return self.ntasks


@with_lists(ENVIRONMENT_LISTS)
class SlurmTaskPerNode(_SlurmBase):
    """Each srun task spawns ``nprocs / ntasks`` training processes."""

    name = "slurm (one task per node, spawning)"
    spawns = True

    @property
    def per_task(self) -> int:
        return self.nprocs // self.ntasks

    def _tasks_fit(self) -> bool:
        return self._tasks_spawn(self.env, self.nprocs)
