"""The Slurm recipes, submitted for real with ``sbatch --wait`` to a one-node Slurm.

The node is this machine (2 cores, no GPU) declared with two GPUs backed by /dev/null, so
the recipes' ``--gpus-per-task`` requests are scheduled and bound (CUDA_VISIBLE_DEVICES)
as on a GPU node, while the training itself runs on the CPU: every job gets the recipe's
own CPU overrides (COMPUTE_SETUP=cpu BACKEND=gloo) and sbatch options sized for 2 cores.
The multi-node recipes run with one node (``--nodes=1 --ntasks=1``): this cluster has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from _support import (
    FIT,
    LAUNCH,
    SEED_TRAIN,
    assert_ranks,
    assert_trained,
    base_env,
    describe_lines,
    lm_params,
    losses,
)
from slurm_cluster import SlurmCluster

FIT_LM = Path(__file__).resolve().parent / "scripts" / "fit_lm.py"

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess]

CPU = {"COMPUTE_SETUP": "cpu", "BACKEND": "gloo"}
#: Every job: a time limit, so that a hang ends in Slurm too, and memory this node has.
LIMITS = ["--time=10", "--mem=4G"]
JOB_TIMEOUT = 600.0
SPAWNING = "slurm (one task per node, spawning)"


@dataclass(frozen=True)
class Case:
    recipe: str
    sbatch_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    world_size: int
    launcher: str  # as the trainer names it in its opening line
    gpus_per_rank: int  # entries of CUDA_VISIBLE_DEVICES each rank sees


CASES = [
    Case("single_gpu.sbatch", ("--cpus-per-task=1",), (), 1,
         "slurm (one task per process)", 1),
    Case("single_gpu_torchrun.sbatch", ("--cpus-per-task=1",), (), 1, "torchrun", 1),
    # One task that spawns 2 processes.
    Case("multi_gpu.sbatch", ("--cpus-per-task=2",), (("NPROCS", "2"),), 2, SPAWNING, 2),
    Case("multi_gpu_torchrun.sbatch", ("--cpus-per-task=2",), (), 2, "torchrun", 2),
    # NODES=1: the only multi-node layout one machine can run.
    Case("multi_node.sbatch", ("--nodes=1", "--ntasks=1", "--cpus-per-task=2"), (), 2,
         SPAWNING, 2),
    # A CPU partition: no GPU asked for (--gpus-per-task=0), 2 workers by GPUS_PER_NODE.
    Case("multi_node_torchrun.sbatch",
         ("--nodes=1", "--ntasks=1", "--cpus-per-task=2", "--gpus-per-task=0"),
         (("GPUS_PER_NODE", "2"),), 2, "torchrun", 0),
]  # fmt: skip


def _submit(
    slurm: SlurmCluster, recipe: str, args: tuple[str, ...], env: dict[str, str], cwd: Path
):  # type: ignore[no-untyped-def]
    return slurm.sbatch(
        LAUNCH / "slurm" / recipe, args=[*LIMITS, *args], env=base_env(env), cwd=cwd,
        timeout=JOB_TIMEOUT,
    )  # fmt: skip


def test_cluster_has_one_idle_node_with_two_gpus(slurm: SlurmCluster) -> None:
    import subprocess

    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T %c %G"], env=slurm.env, capture_output=True,
        text=True, timeout=30, check=True,
    ).stdout.split()  # fmt: skip
    assert out[0] == slurm.node_name and out[1] in ("idle", "mixed", "allocated"), out
    assert out[3].startswith("gpu:2"), out


def test_gpus_are_bound_per_task(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Two tasks of one GPU each see different CUDA_VISIBLE_DEVICES, as on a GPU node."""
    script = tmp_path / "where.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "srun bash -c 'echo \"task $SLURM_PROCID of $SLURM_NTASKS gpu $CUDA_VISIBLE_DEVICES\"'\n"
    )
    job = slurm.sbatch(
        script, args=["--ntasks=2", "--gpus-per-task=1", "--cpus-per-task=1", *LIMITS],
        env=base_env(), cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert job.returncode == 0 and job.state == "COMPLETED", job.describe()
    lines = sorted(line for line in job.output.splitlines() if line.startswith("task "))
    assert len(lines) == 2, job.describe()
    assert {line.split()[-1] for line in lines} == {"0", "1"}, lines


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.recipe)
def test_recipe_trains_on_cpu(case: Case, slurm: SlurmCluster, tmp_path: Path) -> None:
    env = {**CPU, "SCRIPT": str(FIT), **dict(case.env)}
    job = _submit(slurm, case.recipe, case.sbatch_args, env, tmp_path)
    assert job.returncode == 0 and job.state == "COMPLETED", job.describe()
    assert_trained(job.output, world_size=case.world_size, epochs=60, print_every=10)
    assert describe_lines(job.output)[0]["where"] == case.launcher, job.output
    ranks = assert_ranks(job.output, case.world_size)
    assert sorted(r.local_rank for r in ranks) == list(range(case.world_size))
    assert {r.host for r in ranks} == {slurm.node_name}
    # Slurm bound the requested (stand-in) GPUs: each rank sees them, as on a GPU node.
    seen = {r.cuda_visible_devices for r in ranks}
    if case.gpus_per_rank == 0:
        assert seen == {"-"}, ranks
    else:
        assert {len(c.split(",")) for c in seen} == {case.gpus_per_rank}, ranks


def test_seed_script_runs_unchanged_under_multi_gpu(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The seeds' own command, `srun python3 train.py --backend ... --nprocs 2`, on CPU."""
    env = {**CPU, "SCRIPT": str(SEED_TRAIN), "NPROCS": "2"}
    job = _submit(slurm, "multi_gpu.sbatch", ("--cpus-per-task=2",), env, tmp_path)
    assert job.returncode == 0 and job.state == "COMPLETED", job.describe()
    head = describe_lines(job.output)
    assert len(head) == 1 and head[0]["world"] == "2" and head[0]["epochs"] == "50", head
    assert [s for s, _ in losses(job.output)] == list(range(5, 51, 5)), job.output


def test_wrong_nprocs_fails_fast_with_a_hint(slurm: SlurmCluster, tmp_path: Path) -> None:
    """3 processes asked of 2 tasks: the trainer refuses before any rendezvous (no hang)."""
    env = {**CPU, "SCRIPT": str(FIT), "NPROCS": "3"}
    job = _submit(slurm, "single_gpu.sbatch", ("--ntasks=2", "--cpus-per-task=1"), env, tmp_path)
    assert job.returncode != 0 and job.state == "FAILED", job.describe()
    assert "HINT" in job.output and "nprocs" in job.output, job.output
    assert losses(job.output) == []


LM_CASES = [
    # One task that spawns the 2 processes.
    Case("multi_gpu.sbatch", ("--cpus-per-task=2",), (("NPROCS", "2"),), 2, SPAWNING, 2),
    # Two tasks, one process each.
    Case("single_gpu.sbatch", ("--ntasks=2", "--cpus-per-task=1"), (("NPROCS", "2"),), 2,
         "slurm (one task per process)", 1),
]  # fmt: skip


@pytest.mark.parametrize("case", LM_CASES, ids=lambda c: c.recipe)
def test_lm_loop_in_two_processes(case: Case, slurm: SlurmCluster, tmp_path: Path) -> None:
    """The LM loop with an LMA in the process group, in both srun layouts: the loss falls
    and both ranks end with the same parameters."""
    env = {**CPU, "SCRIPT": str(FIT_LM), **dict(case.env)}
    job = _submit(slurm, case.recipe, case.sbatch_args, env, tmp_path)
    assert job.returncode == 0 and job.state == "COMPLETED", job.describe()
    assert_trained(job.output, world_size=2, epochs=20, print_every=10)
    head = describe_lines(job.output)[0]
    assert head["loop"] == "LM loop" and head["where"] == case.launcher, job.output
    ranks = assert_ranks(job.output, 2)
    assert sorted(r.rank for r in ranks) == [0, 1]
    finals = lm_params(job.output)
    assert sorted(finals) == [0, 1] and finals[0] == finals[1], finals
