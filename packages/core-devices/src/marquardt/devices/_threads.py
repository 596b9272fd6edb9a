"""How many threads each process on this node may run: one rule for every launcher.

threads per process = ⌊cores / processes⌋, at least 1, where

* *cores* are the CPUs this process may use: the fewest of the physical cores in its CPU
  affinity (``os.sched_getaffinity``; hardware threads of one core count once, as torch's
  default counts them), its cgroup's CPU quota (cgroup v2 ``cpu.max``, v1
  ``cpu.cfs_quota_us / cpu.cfs_period_us``, rounded up) and Slurm's
  ``SLURM_CPUS_PER_TASK``, less the CPU processors Legate takes where the process runs
  Legate (a running runtime's CPU and OpenMP processors, else ``--cpus`` plus
  ``--omps × --ompthreads`` in ``LEGATE_CONFIG``);
* *processes* are the processes sharing those cores: the caller's count (the training
  processes on this node), else ``LOCAL_WORLD_SIZE`` (torchrun), else Slurm's tasks on
  this node (``SLURM_NTASKS_PER_NODE``, or this node's entry of ``SLURM_TASKS_PER_NODE``),
  else 1. Cores read from ``SLURM_CPUS_PER_TASK`` belong to one task, so they are shared
  only by the processes that task runs (the caller's count divided by the tasks on this
  node, rounded up; else 1).

An explicit ``OMP_NUM_THREADS`` or a count the caller was given (a ``TrainConfig``
setting) always wins over the rule; `apply_threads` adds a count the user set with
``torch.set_num_threads``. Without it, processes that each keep torch's default (every
core) run ``processes × cores`` busy threads on ``cores`` cores and spin against each other
in every kernel and every collective; torchrun sets ``OMP_NUM_THREADS=1`` for the same reason.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import _settings
from ._errors import DeviceError
from ._legate import running_cpus
from .messages import message

#: Where the cgroup file systems are mounted, and where this process's cgroup is named.
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
#: Where Linux describes the CPUs (each one's physical core).
CPU_ROOT = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class CpuBudget:
    """The CPUs one process may use, and what limits them.

    Arguments:
        cores: the number of CPUs (at least 1).
        source: the limit that gave ``cores``: ``"CPU affinity"``, ``"cgroup cpu.max"``,
            ``"cgroup cpu.cfs_quota_us"`` or ``"SLURM_CPUS_PER_TASK"``, with
            ``" less Legate's --cpus N"`` where Legate takes some.
        per_task: True when ``cores`` are one Slurm task's (not shared with other tasks).
    """

    cores: int
    source: str
    per_task: bool = False


@dataclass(frozen=True)
class ThreadChoice:
    """The threads one process runs, and why.

    Arguments:
        threads: the count (at least 1).
        source: ``"OMP_NUM_THREADS"``, ``"setting"`` (a count the caller was given),
            ``"torch.set_num_threads"`` (set by the user before the run) or ``"rule"``.
        cores: the CPU budget the rule divided (``None`` when the rule was not used).
        processes: the processes sharing ``cores`` (``None`` when the rule was not used).
        processes_source: where ``processes`` was read (``"LOCAL_WORLD_SIZE"``, ...).
    """

    threads: int
    source: str
    cores: CpuBudget | None = None
    processes: int | None = None
    processes_source: str = ""

    def describe(self) -> str:
        """The choice in words, for the run's log.

        Returns:
            e.g. ``"1 thread per process (rule: 2 cores from CPU affinity / 2 processes
            from nprocs)"``.
        """
        noun = "thread" if self.threads == 1 else "threads"
        if self.cores is None:
            return f"{self.threads} {noun} per process ({self.source})"
        cores = "core" if self.cores.cores == 1 else "cores"
        processes = "process" if self.processes == 1 else "processes"
        return (
            f"{self.threads} {noun} per process (rule: {self.cores.cores} {cores} from "
            f"{self.cores.source} / {self.processes} {processes} from {self.processes_source})"
        )


def _whole(value: str | None) -> int | None:
    """A positive whole number from a variable's text (``None`` when absent or not one)."""
    if value is None:
        return None
    text = value.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def physical_cores(cpus: set[int] | None = None, cpu_root: Path = CPU_ROOT) -> int:
    """The physical cores among ``cpus`` (each core once, however many hardware threads).

    Arguments:
        cpus: CPU numbers (default: every CPU Linux lists).
        cpu_root: where Linux describes the CPUs (a test passes a folder of files).

    Returns:
        The number of distinct cores; a CPU whose core cannot be read counts as one.
    """
    if cpus is None:
        cpus = {int(p.name[3:]) for p in cpu_root.glob("cpu[0-9]*") if p.name[3:].isdigit()}
        if not cpus:
            return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        try:
            cores.add((cpu_root / f"cpu{cpu}" / "topology" / "core_cpus_list").read_text().strip())
        except OSError:
            cores.add(f"cpu{cpu}")
    return max(1, len(cores))


def _cgroup_v2_quota(text: str) -> float | None:
    """CPUs from ``cpu.max`` (``"max 100000"`` is no limit)."""
    words = text.split()
    if len(words) != 2 or words[0] == "max":
        return None
    return int(words[0]) / int(words[1]) if int(words[1]) > 0 else None


def _cgroup_v1_quota(folder: Path) -> float | None:
    """CPUs from ``cpu.cfs_quota_us / cpu.cfs_period_us`` (a quota of -1 is no limit)."""
    quota = int((folder / "cpu.cfs_quota_us").read_text().strip())
    period = int((folder / "cpu.cfs_period_us").read_text().strip())
    return quota / period if quota > 0 and period > 0 else None


def _cgroup_folders(root: Path, proc_cgroup: Path) -> list[tuple[Path, str]]:
    """The cgroup folders whose CPU quota limits this process, nearest first, with the
    file that holds the quota: its own cgroup and its ancestors, v2 then v1."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    found: list[tuple[Path, str]] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        names = controllers.split(",")
        if parts[0] == "0" and controllers == "":
            bases = [(root, "cpu.max")]
        elif "cpu" in names:
            bases = [(root / controllers, "cpu.cfs_quota_us"), (root / "cpu", "cpu.cfs_quota_us")]
        else:
            continue
        for base, name in bases:
            folder = base / path.lstrip("/")
            chain = [folder, *folder.parents]
            found += [(f, name) for f in chain if f.is_relative_to(base) and (f / name).exists()]
    return found


def cgroup_cpus(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP
) -> tuple[float, str] | None:
    """The CPU quota of this process's cgroup (the least along its ancestors).

    Arguments:
        root: where the cgroup file systems are mounted (a test passes a folder of files).
        proc_cgroup: the file naming this process's cgroups (``/proc/self/cgroup``).

    Returns:
        (CPUs, the file name that gave them), or ``None`` where no quota limits the process
        (or nothing can be read).
    """
    least: tuple[float, str] | None = None
    for folder, name in _cgroup_folders(root, proc_cgroup):
        try:
            if name == "cpu.max":
                cpus = _cgroup_v2_quota((folder / name).read_text())
            else:
                cpus = _cgroup_v1_quota(folder)
        except (OSError, ValueError):
            continue
        if cpus is not None and (least is None or cpus < least[0]):
            least = (cpus, f"cgroup {name}")
    return least


def legate_cpus(config: str) -> int:
    """CPU processors Legate takes by ``LEGATE_CONFIG``: ``--cpus N`` plus
    ``--omps K × --ompthreads T`` (the last of each flag wins; 0 where none is named).

    Arguments:
        config: the text of ``LEGATE_CONFIG``.

    Returns:
        The number of CPUs Legate's processors occupy.
    """
    try:
        words = shlex.split(config)
    except ValueError:
        return 0  # marquardt.devices.legate_share names the unreadable configuration
    flags: dict[str, int] = {}
    for position, word in enumerate(words):
        name, _, value = word.partition("=")
        if name in ("--cpus", "--omps", "--ompthreads"):
            if not value and position + 1 < len(words):
                value = words[position + 1]
            flags[name] = int(value) if value.isdigit() else 0
    return flags.get("--cpus", 0) + flags.get("--omps", 0) * flags.get("--ompthreads", 0)


def cpu_budget(
    env: Mapping[str, str] | None = None,
    affinity: Callable[[], set[int]] | None = None,
    cgroup: tuple[float, str] | bool | None = True,
    legate: int | None = None,
) -> CpuBudget:
    """The CPUs this process may use, and the limit that gave them.

    Arguments:
        env: the variables to read (default: this process's, through the settings module).
        affinity: returns this process's CPU set (default ``os.sched_getaffinity(0)``;
            every CPU where there is none); its physical cores are counted.
        cgroup: the cgroup quota as `cgroup_cpus` gives it, ``None`` for none, or True to
            read this process's.
        legate: the CPUs Legate's processors occupy (default: a running Legate runtime's
            CPU and OpenMP processors, else `legate_cpus` of ``LEGATE_CONFIG``).

    Returns:
        The `CpuBudget`: the fewest of affinity, quota (rounded up) and
        ``SLURM_CPUS_PER_TASK``, less Legate's CPUs (at least 1).
    """
    env = _settings.thread_settings() if env is None else env
    if affinity is None and hasattr(os, "sched_getaffinity"):
        cpus: set[int] | None = set(os.sched_getaffinity(0))
    else:
        cpus = set(affinity()) if affinity is not None else None
    limits = [(physical_cores(cpus), "CPU affinity")]
    quota = cgroup_cpus() if cgroup is True else cgroup
    if isinstance(quota, tuple):
        limits.append((max(1, math.ceil(quota[0] - 1e-9)), quota[1]))
    slurm = _whole(env.get("SLURM_CPUS_PER_TASK"))
    if slurm is not None:
        limits.append((slurm, "SLURM_CPUS_PER_TASK"))
    cores, source = min(limits, key=lambda pair: pair[0])
    running = running_cpus() if legate is None else legate
    taken = running if running is not None else legate_cpus(env.get("LEGATE_CONFIG", ""))
    if taken:
        cores, source = max(1, cores - taken), f"{source} less Legate's --cpus {taken}"
    return CpuBudget(cores, source, per_task=slurm is not None)


def slurm_tasks_here(env: Mapping[str, str]) -> int | None:
    """The Slurm tasks on this node: ``SLURM_NTASKS_PER_NODE``, else this node's entry of
    ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"``: 2 on nodes 0-2, 1 on node 3; by
    ``SLURM_NODEID``).

    Arguments:
        env: the variables to read.

    Returns:
        The count, or ``None`` where Slurm says nothing readable.
    """
    count = _whole(env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0])
    if count is not None:
        return count
    counts: list[int] = []
    for entry in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        tasks, _, repeat = entry.partition("(x")
        if not tasks.strip().isdigit():
            return None
        counts += [int(tasks)] * (int(repeat.rstrip(")")) if repeat.rstrip(")").isdigit() else 1)
    node = env.get("SLURM_NODEID", "0").strip()
    index = int(node) if node.isdigit() else 0
    return counts[index] if index < len(counts) and counts[index] > 0 else None


def _processes(
    env: Mapping[str, str], budget: CpuBudget, processes: int | None, processes_from: str
) -> tuple[int, str]:
    if budget.per_task:  # a task's own CPUs: only the processes of this task share them
        tasks = slurm_tasks_here(env) or 1
        if processes is None:
            return 1, "one Slurm task"
        return max(1, -(-processes // tasks)), f"{processes_from} per Slurm task"
    if processes is not None:
        return processes, processes_from
    count = _whole(env.get("LOCAL_WORLD_SIZE"))
    if count is not None:
        return count, "LOCAL_WORLD_SIZE"
    count = slurm_tasks_here(env)
    if count is not None:
        return count, "Slurm's tasks per node"
    return 1, "one process"


def threads_per_process(
    processes: int | None = None,
    requested: int | None = None,
    processes_from: str = "nprocs",
    env: Mapping[str, str] | None = None,
    budget: CpuBudget | None = None,
) -> ThreadChoice:
    """How many threads this process should run: the rule of this module, or what wins over it.

    Arguments:
        processes: the training processes on this node (a spawn's ``nprocs`` there);
            ``None`` reads ``LOCAL_WORLD_SIZE``, then Slurm's tasks on this node.
        requested: a count the caller was given (a ``TrainConfig`` setting); wins.
        processes_from: how ``processes`` is named in the log (``"nprocs"``).
        env: the variables to read (default: this process's).
        budget: the CPUs to divide (default: `cpu_budget` of this process).

    Returns:
        A `ThreadChoice`: ``requested`` (source ``"setting"``), else ``OMP_NUM_THREADS``,
        else ⌊cores / processes⌋, at least 1 (source ``"rule"``).

    Raises:
        DeviceError: ``requested`` or ``processes`` is below 1.
    """
    for name, value in (("requested", requested), ("processes", processes)):
        if value is not None and value < 1:
            raise DeviceError(
                message(
                    f"threads_per_process({name}={value}) was asked for a thread count",
                    f"{name} must be a whole number >= 1",
                    f"pass {name}=None for the default, or a count of 1 or more",
                )
            )
    env = _settings.thread_settings() if env is None else env
    if requested is not None:
        return ThreadChoice(requested, "setting")
    omp = _whole(env.get("OMP_NUM_THREADS"))
    if omp is not None:
        return ThreadChoice(omp, "OMP_NUM_THREADS")
    budget = cpu_budget(env) if budget is None else budget
    count, source = _processes(env, budget, processes, processes_from)
    return ThreadChoice(max(1, budget.cores // count), "rule", budget, count, source)
