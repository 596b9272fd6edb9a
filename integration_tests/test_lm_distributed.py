"""LM over torch.distributed through its recipes: 2 CPU workers with gloo, for real.

``launch/torchrun/lm_multi_node.sh`` on one "node" of two workers, and
``launch/slurm/lm_multi_node.sbatch`` submitted to the local one-node Slurm (one torchrun
agent, two workers), both running ``examples/lm_distributed.py``: the loss falls, both
ranks end with the same λ and the same Σθ, and the after-step agreement check
(``MARQUARDT_SOLVER_CHECK_RANKS=1``) held at every step.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _support import FLOAT, LAUNCH, ROOT, base_env, run
from marquardt.testing.processes import free_port
from slurm_cluster import SlurmCluster

EXAMPLE = ROOT / "examples" / "lm_distributed.py"
STEPS = 15
# Numbers are matched as numbers (``_support.FLOAT``): the ranks share one stdout.
_RANK = re.compile(rf"lm-rank: rank (\d+) world (\d+) damping {FLOAT} theta-sum {FLOAT}")
_SUMMARY = re.compile(rf"lm-summary: world (\d+) steps (\d+) first {FLOAT} last {FLOAT}")


def _env(extra: dict[str, str]) -> dict[str, str]:
    return base_env(
        {"SCRIPT": str(EXAMPLE), "BACKEND": "gloo", "MARQUARDT_SOLVER_CHECK_RANKS": "1", **extra}
    )


def assert_lm_run(output: str, world: int) -> None:
    """The loss fell over the steps and every rank ended in the same state."""
    summary = _SUMMARY.findall(output)
    assert len(summary) == 1, output[-3000:]
    size, steps, first, last = summary[0]
    assert int(size) == world and int(steps) == STEPS, summary
    assert float(last) < 0.5 * float(first), summary
    ranks = _RANK.findall(output)
    assert sorted(int(r[0]) for r in ranks) == list(range(world)), output[-3000:]
    assert len({(r[2], r[3]) for r in ranks}) == 1, ranks


@pytest.mark.multiprocess
def test_torchrun_recipe_runs_lm_on_two_workers(tmp_path: Path) -> None:
    port = free_port()
    env = _env(
        {
            "NNODES": "1", "NPROC_PER_NODE": "2", "HEAD_NODE": "127.0.0.1",
            "RDZV_PORT": str(port), "RDZV_ID": f"lm-{port}", "RDZV_CONF": "is_host=1",
        }
    )  # fmt: skip
    done = run(
        ["bash", str(LAUNCH / "torchrun" / "lm_multi_node.sh"), "--steps", str(STEPS)],
        env=env,
        cwd=tmp_path,
        timeout=240.0,
    )
    assert done.returncode == 0, done.describe()
    assert_lm_run(done.output, world=2)


@pytest.mark.slurm
@pytest.mark.multiprocess
def test_slurm_recipe_runs_lm_on_two_workers(slurm: SlurmCluster, tmp_path: Path) -> None:
    """One node (this cluster has one), one torchrun agent, two CPU workers."""
    env = _env({"NPROC_PER_NODE": "2", "RDZV_PORT": str(free_port())})
    job = slurm.sbatch(
        LAUNCH / "slurm" / "lm_multi_node.sbatch",
        args=["--time=10", "--mem=4G", "--nodes=1", "--ntasks=1", "--cpus-per-task=2",
              "--gpus-per-task=0"],
        env=env, cwd=tmp_path, timeout=600.0,
        script_args=["--steps", str(STEPS)],
    )  # fmt: skip
    assert job.returncode == 0 and job.state == "COMPLETED", job.describe()
    assert_lm_run(job.output, world=2)
