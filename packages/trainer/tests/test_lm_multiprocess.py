"""The LM loop in 2 processes (gloo, CPU), each taking its share of the global batch from the
DistributedSampler and the LMA combining them over the process group: under spawn and
torchrun the loss falls and the ranks agree; SIGTERM checkpoints; kill-and-resume reproduces
the uninterrupted run; a rank killed inside an LM step ends the run, naming it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from marquardt.testing.processes import free_port
from marquardt.trainer._persistence import _files as ckpt

from .conftest import SCRIPTS, Processes, read_json

pytestmark = pytest.mark.multiprocess

JOB = str(SCRIPTS / "job.py")
#: LM on sinc(3x), 64 samples: 2 ranks of 16 (a global batch of 32 for P = 25 parameters).
LM = ["--loop", "lm", "--batch-size", "16", "--shuffle", "--dist-timeout", "30"]


def _initial_loss() -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), torch.sinc(3 * x)))


def _ranks_agree(cwd: Path) -> list[float]:
    zero, one = (read_json(cwd / f"params_{rank}.json") for rank in (0, 1))
    assert zero == one  # bitwise: every rank took the same steps
    return zero  # type: ignore[return-value]


def test_lm_in_two_spawned_processes_the_loss_falls_and_the_ranks_agree(
    tmp_path: Path, procs: Processes
) -> None:
    code, out, err = procs.run(
        [
            *(JOB, *LM, "--nprocs", "2", "--max-iter", "5", "--checkpoint-every", "5"),
            *("--rank-params", "--out", "two.json"),
        ],
        cwd=tmp_path,
    )
    assert code == 0, err
    assert "LM loop, spawn, world size 2" in out
    result = read_json(tmp_path / "two.json")  # from the parent's model: rank 0's weights
    assert result["loss"] < 0.2 * _initial_loss()
    assert result["params"] == pytest.approx(_ranks_agree(tmp_path), abs=0)
    # 6 epochs of 2 global batches: 12 LM steps, checkpointed after epoch 5, the last
    saved = ckpt.read_checkpoint(tmp_path / "runs" / "checkpoints" / ckpt.checkpoint_name(12))
    assert saved["kind"] == "lm" and saved["world_size"] == 2
    assert saved["lma"]["steps"] == 12 and saved["lm_report"]["rows"] == 32  # the global batch


def test_lm_under_torchrun(tmp_path: Path, procs: Processes) -> None:
    args = [
        *("-m", "torch.distributed.run", "--nproc_per_node", "2"),
        *("--master_port", str(free_port())),
        *(JOB, *LM, "--lm-factory", "--max-iter", "5", "--rank-params", "--out", "two.json"),
    ]
    code, out, err = procs.run(args, cwd=tmp_path)
    assert code == 0, err
    assert "LM loop, torchrun, world size 2" in out
    assert read_json(tmp_path / "two.json")["loss"] < 0.2 * _initial_loss()
    _ranks_agree(tmp_path)


def test_lm_sigterm_checkpoints_and_kill_and_resume_reproduces(
    tmp_path: Path, procs: Processes
) -> None:
    # 8 epochs of 2 steps, a checkpoint every 2 epochs: steps 6, 10, 14 and 16 at the end
    common = [JOB, *LM, "--nprocs", "2", "--max-iter", "7", "--checkpoint-every", "2"]
    code, _, err = procs.run([*common, "--root", "straight", "--out", "straight.json"], tmp_path)
    assert code == 0, err
    # SIGKILL of rank 1 after step 12: the run fails, the checkpoint of step 10 is whole.
    code, _, err = procs.run(
        [*common, "--root", "killed", *("--fault", "sigkill", "--fault-rank", "1"),
         "--fault-step", "12"],
        tmp_path,
    )  # fmt: skip
    assert code != 0 and "rank 1 was killed by signal SIGKILL" in err, err
    assert ckpt.list_checkpoints(tmp_path / "killed" / "checkpoints")[-1][0] == 10
    code, out, err = procs.run(
        [*common, "--root", "killed", "--resume", "latest", "--out", "resumed.json"], tmp_path
    )
    assert code == 0, err
    assert "resumed from killed/checkpoints/" + ckpt.checkpoint_name(10) in out
    straight, resumed = (read_json(tmp_path / f"{n}.json") for n in ("straight", "resumed"))
    difference = max(abs(a - b) for a, b in zip(straight["params"], resumed["params"], strict=True))
    print(f"LM 2 processes kill+resume: max |θ - θ_uninterrupted| = {difference:.3e}")
    assert resumed["step"] == 16 and difference < 1e-6
    # SIGTERM to the spawning parent at step 4: every rank stops, one checkpoint, status 0.
    code, _, err = procs.run(
        [*common, "--root", "term", "--fault", "sigterm-parent", "--fault-step", "4"], tmp_path
    )
    assert code == 0 and "exiting with status 0" in err, err
    ((step, path),) = ckpt.list_checkpoints(tmp_path / "term" / "checkpoints")
    assert 4 <= step < 16 and ckpt.read_checkpoint(path)["lma"]["steps"] == step


def test_a_rank_killed_inside_an_lm_step_ends_the_run_naming_it(
    tmp_path: Path, procs: Processes
) -> None:
    began = time.monotonic()
    code, _, err = procs.run(
        [JOB, *LM, "--nprocs", "2", "--max-iter", "1000", "--kill-in-step", "1", "40"],
        cwd=tmp_path,
        timeout=150,
    )
    elapsed = time.monotonic() - began
    assert code != 0
    assert "rank 1 was killed by signal SIGKILL" in err, err
    assert elapsed < 150
    print(f"rank 1 killed inside an LM step: the run ended after {elapsed:.1f} s")


_FREED = """
import sys
import torch.distributed as dist
from marquardt.trainer import _distributed as pg
from marquardt.trainer._environments import ProcessLayout

layout = ProcessLayout(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                       master_addr="127.0.0.1", master_port=int(sys.argv[1]))
pg.init_process_group(layout, "gloo", 30.0, f"tcp://127.0.0.1:{sys.argv[1]}")
group = dist.distributed_c10d._get_default_group()
from torch.func import functional_call, jacrev, vmap  # what the LM loop's first step uses
import torch._dynamo
pg.destroy_process_group()
print(sys.getrefcount(group) - 1)  # the references left but this one
"""


def test_the_process_group_is_freed_when_destroyed(tmp_path: Path, procs: Processes) -> None:
    """torch._dynamo, imported after the group is made (torch.func does on the LM loop's
    first step), would keep the group, and gloo's threads, alive past the destroy, and about
    one exit in ten aborted ("terminate called without an active exception"). Nothing but
    the script's own name is left holding it."""
    script = tmp_path / "freed.py"
    script.write_text(_FREED)
    code, out, err = procs.run([str(script), str(free_port())], cwd=tmp_path)
    assert code == 0, err
    assert out.split()[-1] == "1", out
