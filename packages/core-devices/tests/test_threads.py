"""The thread rule: cores this process may use (affinity, cgroup quota, Slurm) over the
processes sharing them, from injected values; what wins over it; applying it to torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from marquardt.devices import (
    CpuBudget,
    DeviceError,
    ThreadChoice,
    applied_threads,
    apply_threads,
    cpu_budget,
    threads_per_process,
)
from marquardt.devices._threads import (
    cgroup_cpus,
    legate_cpus,
    physical_cores,
    slurm_tasks_here,
)

SRC = str(Path(__file__).resolve().parents[1] / "src")


#: CPU numbers no machine here has, so each counts as a core of its own.
def cpus(n: int) -> set[int]:
    return set(range(10_000, 10_000 + n))


def budget(n: int, env: dict[str, str] | None = None, quota: tuple[float, str] | None = None):
    return cpu_budget(env or {}, affinity=lambda: cpus(n), cgroup=quota)


def test_affinity_divided_by_local_world_size() -> None:
    env = {"LOCAL_WORLD_SIZE": "4"}
    choice = threads_per_process(env=env, budget=budget(16, env))
    assert (choice.threads, choice.source, choice.processes_source) == (
        4,
        "rule",
        "LOCAL_WORLD_SIZE",
    )
    assert choice.cores == CpuBudget(16, "CPU affinity")
    assert (
        "4 threads per process (rule: 16 cores from CPU affinity / 4 processes" in choice.describe()
    )


def test_at_least_one_thread_and_rounding_down() -> None:
    assert threads_per_process(3, env={}, budget=budget(2)).threads == 1
    assert threads_per_process(2, env={}, budget=budget(7)).threads == 3
    assert threads_per_process(env={}, budget=budget(5)).processes_source == "one process"


def test_slurm_tasks_per_node_when_torchrun_says_nothing() -> None:
    env = {"SLURM_NTASKS_PER_NODE": "2(x3)"}
    choice = threads_per_process(env=env, budget=budget(8, env))
    assert (choice.threads, choice.processes, choice.processes_source) == (
        4,
        2,
        "Slurm's tasks per node",
    )


def test_slurm_cpus_per_task_are_one_tasks() -> None:
    # srun one task per process, 4 CPUs each, 2 tasks on the node: 4 threads each.
    env = {"SLURM_CPUS_PER_TASK": "4", "SLURM_NTASKS_PER_NODE": "2"}
    b = budget(64, env)
    assert (b.cores, b.source, b.per_task) == (4, "SLURM_CPUS_PER_TASK", True)
    assert threads_per_process(env=env, budget=b).threads == 4
    # one task per node spawning 4 of the node's 8 processes: the task's 4 CPUs over 4
    assert threads_per_process(8, env=env, budget=b).threads == 1


def test_slurm_tasks_per_node_read_for_this_node() -> None:
    env = {"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}
    assert slurm_tasks_here(env) == 1
    assert slurm_tasks_here({**env, "SLURM_NODEID": "1"}) == 2
    assert slurm_tasks_here({"SLURM_TASKS_PER_NODE": "bad"}) is None
    # srun one task per process, 3 tasks on node 0, 6 CPUs each, no --ntasks-per-node:
    # the trainer passes the node's 3 processes, each its own task's 6 CPUs
    slurm = {"SLURM_CPUS_PER_TASK": "6", "SLURM_TASKS_PER_NODE": "3(x2)", "SLURM_NODEID": "0"}
    assert threads_per_process(3, env=slurm, budget=budget(64, slurm)).threads == 6


def test_cgroup_quota_rounds_up_and_is_the_least_limit() -> None:
    b = budget(16, quota=(2.5, "cgroup cpu.max"))
    assert (b.cores, b.source) == (3, "cgroup cpu.max")
    assert threads_per_process(3, env={}, budget=b).threads == 1
    assert budget(2, quota=(8.0, "cgroup cpu.max")).source == "CPU affinity"


def _cgroup_tree(tmp_path: Path, lines: str) -> tuple[Path, Path]:
    proc = tmp_path / "cgroup"
    proc.write_text(lines)
    return tmp_path / "fs", proc


def test_cgroup_v2_cpu_max_least_along_ancestors(tmp_path: Path) -> None:
    root, proc = _cgroup_tree(tmp_path, "0::/job/step\n")
    (root / "job" / "step").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")  # no limit at the top
    (root / "job" / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs for the job
    (root / "job" / "step" / "cpu.max").write_text("400000 100000\n")
    assert cgroup_cpus(root, proc) == (1.5, "cgroup cpu.max")
    (root / "job" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(root, proc) == (4.0, "cgroup cpu.max")
    (root / "job" / "step" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(root, proc) is None


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    root, proc = _cgroup_tree(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n")
    folder = root / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("200000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(root, proc) == (2.0, "cgroup cpu.cfs_quota_us")
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpus(root, proc) is None
    assert cgroup_cpus(tmp_path / "absent", tmp_path / "absent.txt") is None


def test_legate_cpus_come_off_the_cores() -> None:
    assert legate_cpus("--cpus 2 --sysmem 4000") == 2
    assert legate_cpus("--omps=2 --ompthreads 3 --cpus=1") == 7
    assert legate_cpus("--gpus 1") == 0 and legate_cpus("'unbalanced") == 0
    env = {"LEGATE_CONFIG": "--cpus 2"}
    b = budget(8, env)
    assert (b.cores, b.source) == (6, "CPU affinity less Legate's --cpus 2")
    assert budget(2, {"LEGATE_CONFIG": "--cpus 4"}).cores == 1


def test_physical_cores_count_hardware_threads_once(tmp_path: Path) -> None:
    for cpu, core in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "core_cpus_list").write_text(core + "\n")
    assert physical_cores({0, 1, 2, 3}, tmp_path) == 2
    assert physical_cores({0, 2}, tmp_path) == 1
    assert physical_cores(None, tmp_path) == 2


def test_explicit_counts_win() -> None:
    env = {"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "8"}
    assert threads_per_process(env=env, budget=budget(2)) == ThreadChoice(3, "OMP_NUM_THREADS")
    assert threads_per_process(4, requested=5, env=env).source == "setting"
    # a malformed OMP_NUM_THREADS is not a count: the rule decides
    assert threads_per_process(2, env={"OMP_NUM_THREADS": "x"}, budget=budget(4)).threads == 2
    with pytest.raises(DeviceError, match="HINT"):
        threads_per_process(requested=0)
    with pytest.raises(DeviceError, match="processes must be a whole number"):
        threads_per_process(processes=0)


# Fresh interpreters: torch's thread count is process state.
PROBE = """
import json, os, sys, torch
from marquardt.devices import apply_threads, applied_threads, choose_threads
mode = sys.argv[1]
if mode == "user":
    torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
    before = torch.get_num_threads()
choice = choose_threads(int(sys.argv[2]))
apply_threads(choice)
again = choose_threads(int(sys.argv[2]))
print(json.dumps({"threads": torch.get_num_threads(), "source": choice.source,
                  "again": again.source, "chosen": choice.threads,
                  "kept": applied_threads() is not None}))
"""


def _probe(mode: str, processes: int, **env: str) -> dict[str, object]:
    import json

    base = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    base.pop("LOCAL_WORLD_SIZE", None)
    base["PYTHONPATH"] = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(processes)],
        capture_output=True, text=True, env={**base, **env}, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_apply_sets_torch_by_the_rule() -> None:
    cores = cpu_budget().cores
    out = _probe("rule", 2)
    assert out == {
        "threads": max(1, cores // 2),
        "source": "rule",
        "again": "rule",  # our own count is never taken for the user's
        "chosen": max(1, cores // 2),
        "kept": True,
    }


def test_a_users_omp_num_threads_is_left_alone() -> None:
    # the rule would give one process every core; the user's 1 stays (torch reads it)
    out = _probe("rule", 1, OMP_NUM_THREADS="1")
    assert (out["threads"], out["source"], out["kept"]) == (1, "OMP_NUM_THREADS", False)


def test_a_users_torch_set_num_threads_wins() -> None:
    out = _probe("user", 1)
    assert out["source"] == out["again"] == "torch.set_num_threads"
    assert out["threads"] == out["chosen"]


def test_apply_in_this_process_restores_cleanly() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        apply_threads(ThreadChoice(1, "setting"))
        assert torch.get_num_threads() == 1
        assert applied_threads() == ThreadChoice(1, "setting")
        torch.set_num_threads(2 if before == 1 else before)
        assert applied_threads() is None  # the user changed it since
    finally:
        torch.set_num_threads(before)
