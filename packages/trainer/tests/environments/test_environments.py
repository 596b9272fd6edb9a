"""Launch detection and validation, from environment dictionaries."""

from __future__ import annotations

import pytest

from marquardt.trainer import (
    LaunchError,
    LegateEnvironment,
    PlainEnvironment,
    SlurmTaskPerNode,
    SlurmTaskPerProcess,
    SpawnEnvironment,
    TorchrunEnvironment,
    detect_environment,
)
from marquardt.trainer._environments import (
    expand_hostlist,
    expand_tasks_per_node,
    port_from_job_id,
)

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "abc",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "host0",
    "MASTER_PORT": "29400",
}
SLURM = {
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "gpu-node[07-08]",
    "SLURM_JOB_ID": "123456",
}


def test_plain_is_one_process() -> None:
    env = detect_environment({}, nprocs=1)
    assert isinstance(env, PlainEnvironment)
    env.validate()
    [layout] = env.layouts()
    assert (layout.rank, layout.world_size) == (0, 1)


def test_spawn_lays_out_local_ranks_and_honours_master_port() -> None:
    env = detect_environment({"MASTER_PORT": "23456"}, nprocs=3)
    assert isinstance(env, SpawnEnvironment) and env.spawns
    env.validate()
    layouts = env.layouts()
    assert [lay.rank for lay in layouts] == [0, 1, 2]
    assert {lay.master_port for lay in layouts} == {23456}
    assert {lay.master_addr for lay in layouts} == {"127.0.0.1"}


def test_spawn_picks_a_free_port_once() -> None:
    env = detect_environment({}, nprocs=2)
    ports = {lay.master_port for lay in env.layouts()} | {lay.master_port for lay in env.layouts()}
    assert len(ports) == 1 and 0 < ports.pop() < 65536


@pytest.mark.parametrize(
    ("env_vars", "nprocs", "kind", "master"),
    [
        pytest.param(TORCHRUN, 1, TorchrunEnvironment, ("host0", 29400), id="torchrun"),
        pytest.param(
            SLURM,
            4,
            SlurmTaskPerProcess,
            ("gpu-node07", 15000 + 123456 % 20000),
            id="slurm-task-per-process",
        ),
    ],
)
def test_a_launcher_that_starts_every_process_lays_it_out_from_its_variables(
    env_vars: dict[str, str], nprocs: int, kind: type, master: tuple[str, int]
) -> None:
    env = detect_environment(env_vars, nprocs=nprocs)
    assert isinstance(env, kind) and not env.spawns
    env.validate()
    [layout] = env.layouts()
    assert (layout.rank, layout.local_rank, layout.world_size) == (3, 1, 4)
    assert (layout.local_world_size, layout.node_rank) == (2, 1)
    assert (layout.master_addr, layout.master_port) == master


def test_torchrun_wins_over_slurm_when_srun_starts_torchrun() -> None:
    env = detect_environment({**SLURM, **TORCHRUN}, nprocs=1)
    assert isinstance(env, TorchrunEnvironment)


def test_torchrun_nprocs_must_match_world_size() -> None:
    env = detect_environment(TORCHRUN, nprocs=2)
    with pytest.raises(LaunchError, match=r"nprocs=2 but torchrun started WORLD_SIZE=4.*HINT"):
        env.validate()
    detect_environment(TORCHRUN, nprocs=4).validate()  # equal is fine


def test_torchrun_missing_variables() -> None:
    env = detect_environment({"TORCHELASTIC_RUN_ID": "x", "RANK": "0"}, nprocs=1)
    with pytest.raises(LaunchError, match="LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        env.validate()


@pytest.mark.parametrize(
    ("env_vars", "nprocs", "ranks", "master_addr"),
    [
        pytest.param(
            {
                **SLURM,
                "SLURM_NTASKS": "2",
                "SLURM_PROCID": "1",
                "SLURM_LOCALID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            },
            8,
            [4, 5, 6, 7],
            "gpu-node07",
            id="global-ranks",
        ),
        # srun --ntasks 1 python train.py --nprocs 2 (the seeds' single-node Slurm script)
        pytest.param(
            {
                "SLURM_PROCID": "0",
                "SLURM_LOCALID": "0",
                "SLURM_NTASKS": "1",
                "SLURM_JOB_NODELIST": "n1",
                "SLURM_JOB_ID": "77",
            },
            2,
            [0, 1],
            "n1",
            id="single-task-seed-layout",
        ),
    ],
)
def test_slurm_task_per_node_spawns_its_share_of_the_ranks(
    env_vars: dict[str, str], nprocs: int, ranks: list[int], master_addr: str
) -> None:
    env = detect_environment(env_vars, nprocs=nprocs)
    assert isinstance(env, SlurmTaskPerNode) and env.spawns
    env.validate()
    layouts = env.layouts()
    assert [lay.rank for lay in layouts] == ranks
    assert [lay.local_rank for lay in layouts] == list(range(len(ranks)))
    assert {lay.world_size for lay in layouts} == {nprocs}
    assert {lay.master_addr for lay in layouts} == {master_addr}


@pytest.mark.parametrize("nprocs", [1, 3, 6])
def test_slurm_nprocs_not_matching_tasks(nprocs: int) -> None:
    env = detect_environment(SLURM, nprocs=nprocs)
    with pytest.raises(LaunchError, match=rf"nprocs={nprocs} but srun started 4 tasks.*HINT"):
        env.validate()


def test_slurm_step_variables_win_over_job_variables() -> None:
    env_vars = {
        **SLURM,
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_STEP_NODELIST": "other[3-4]",
    }
    env = detect_environment(env_vars, nprocs=2)
    env.validate()
    assert env.world_size == 2 and env.layouts()[0].master_addr == "other3"


def test_explicit_master_address_and_port_win_under_slurm() -> None:
    env = detect_environment({**SLURM, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}, 4)
    [layout] = env.layouts()
    assert (layout.master_addr, layout.master_port) == ("10.0.0.1", 1234)


def test_legate_detected_and_single_process() -> None:
    env = detect_environment({"LEGATE_CONFIG": "--gpus 2", **SLURM}, nprocs=1)
    assert isinstance(env, LegateEnvironment)
    env.validate()
    bad = detect_environment({"LEGATE_CONFIG": "--cpus 1"}, nprocs=2)
    with pytest.raises(LaunchError, match=r"nprocs=2 but under Legate.*HINT"):
        bad.validate()


def test_more_local_processes_than_gpus() -> None:
    env = detect_environment({}, nprocs=4, gpu_count=2, use_gpu=True)
    with pytest.raises(
        LaunchError, match=r"4 training processes on this node but only 2 GPUs.*HINT"
    ):
        env.validate()
    detect_environment({}, nprocs=2, gpu_count=2, use_gpu=True).validate()
    detect_environment({}, nprocs=4, gpu_count=0, use_gpu=False).validate()  # CPU: no limit


def test_torchrun_more_local_processes_than_gpus() -> None:
    env = detect_environment(TORCHRUN, nprocs=1, gpu_count=1, use_gpu=True)
    with pytest.raises(LaunchError, match="2 training processes on this node but only 1 GPU "):
        env.validate()


def test_slurm_one_gpu_bound_per_task_is_allowed() -> None:
    env = detect_environment(SLURM, nprocs=4, gpu_count=1, use_gpu=True)
    env.validate()  # srun --gpus-per-task=1: each task sees its own GPU as cuda:0
    assert env.device_index(env.layouts()[0]) == 0
    spread = detect_environment(SLURM, nprocs=4, gpu_count=2, use_gpu=True)
    assert spread.device_index(spread.layouts()[0]) == 1


def test_hostlist_expansion() -> None:
    assert expand_hostlist("node[01-03,07]") == ["node01", "node02", "node03", "node07"]
    assert expand_hostlist("a1,b[2-3],c") == ["a1", "b2", "b3", "c"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_hostlist("gpu-[009-011]") == ["gpu-009", "gpu-010", "gpu-011"]
    assert expand_hostlist("single") == ["single"]
    for bad in ("node[1-", "node[3-1]", "node[a-b]", "node]"):
        with pytest.raises(ValueError):
            expand_hostlist(bad)


def test_tasks_per_node_expansion() -> None:
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(ValueError):
        expand_tasks_per_node("2(3)")


def test_port_from_job_id() -> None:
    assert port_from_job_id("123456") == 18456
    assert port_from_job_id("123456") == port_from_job_id("123456")
    assert port_from_job_id("123457") != port_from_job_id("123456")
    assert port_from_job_id(None) == 29500
    assert all(15000 <= port_from_job_id(str(j)) < 35000 for j in range(0, 10**6, 9973))


def test_bad_slurm_nodelist_is_reported() -> None:
    env = detect_environment({**SLURM, "SLURM_JOB_NODELIST": "n[1-"}, nprocs=4)
    with pytest.raises(LaunchError, match="cannot read the node list"):
        env.validate()


def test_malformed_integer_variable() -> None:
    with pytest.raises(ValueError, match=r"SLURM_NTASKS='four' is not an integer.*HINT"):
        detect_environment({**SLURM, "SLURM_NTASKS": "four"}, nprocs=4).validate()
