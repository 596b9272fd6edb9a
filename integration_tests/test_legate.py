"""The Legate recipes run the LM tutorial (examples/sinc_lm.py) on Legate's CPUs.

The PyPI wheels of Legate are GPU builds; the driver stub (core-solver's test support)
stands in for libcuda.so.1 so that Legate starts with CPU processors only, and the solver
runs on cuPyNumeric there. One epoch (10 LM steps of 10000 samples) keeps each run short.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _support import LAUNCH, LM_EXAMPLE, assert_lm_fit, base_env, legate_cpu_env, run
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.legate

ONE_EPOCH = ["--epochs", "1"]
LM_STEPS = 10


def test_single_node_asks_marquardt_devices_and_fits(legate_stub: Path, tmp_path: Path) -> None:
    """LEGATE_GPUS unset: the recipe takes K from `marquardt-devices` (0 here: no GPU)."""
    env = base_env({**legate_cpu_env(legate_stub), "SCRIPT": str(LM_EXAMPLE)})
    env.pop("LEGATE_GPUS", None)
    done = run(
        ["bash", str(LAUNCH / "legate" / "single_node.sh"), *ONE_EPOCH], env=env, cwd=tmp_path,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.describe()
    assert "marquardt-devices recommends 0 Legate GPU(s)" in done.stdout, done.stdout
    assert "legate --sysmem 4000 --gpus 0 --cpus 1 " in done.stdout, done.stdout
    assert_lm_fit(done.stdout, steps=LM_STEPS)


@pytest.mark.slurm
def test_lm_legate_sbatch_fits(slurm: SlurmCluster, legate_stub: Path, tmp_path: Path) -> None:
    env = base_env({
        **legate_cpu_env(legate_stub), "SCRIPT": str(LM_EXAMPLE), "LEGATE_GPUS": "0",
        "LEGATE_CPUS": "1",
    })  # fmt: skip
    job = slurm.sbatch(
        LAUNCH / "slurm" / "lm_legate.sbatch",
        args=["--time=10", "--mem=4G", "--cpus-per-task=2", "--gpus-per-task=1"],
        script_args=ONE_EPOCH, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert job.returncode == 0 and job.state == "COMPLETED", job.describe()
    # Slurm gave the job one (stand-in) GPU; the model side still found no usable GPU.
    assert "CUDA_VISIBLE_DEVICES=0; legate --sysmem 8000 --gpus 0 --cpus 1" in job.output
    assert_lm_fit(job.output, steps=LM_STEPS)


@pytest.mark.slurm
def test_multi_node_recipe_with_one_node_through_srun(
    slurm: SlurmCluster, legate_stub: Path, tmp_path: Path
) -> None:
    """legate --nodes 1 --launcher srun inside a job: the launcher wiring, on one node.

    Two nodes need the conda build of Legate (networking) and a second machine.
    """
    script = tmp_path / "multi_node.sbatch"
    script.write_text(f'#!/bin/bash\nexec bash {LAUNCH / "legate" / "multi_node.sh"} "$@"\n')
    env = base_env({
        **legate_cpu_env(legate_stub), "SCRIPT": str(LM_EXAMPLE), "NODES": "1",
        "LEGATE_GPUS": "0", "SYSMEM": "2000", "MARQUARDT_SOLVER_BACKEND": "cupynumeric",
    })  # fmt: skip
    job = slurm.sbatch(
        script, args=["--time=10", "--mem=4G", "--cpus-per-task=2"], script_args=ONE_EPOCH,
        env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert job.returncode == 0 and job.state == "COMPLETED", job.describe()
    assert_lm_fit(job.output, steps=LM_STEPS)
