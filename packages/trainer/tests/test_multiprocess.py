"""Real multi-process runs (gloo on CPU): the seed script under spawn, torchrun and srun-like
environments, DDP against one process, SIGTERM, a killed worker, kill-and-resume."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.testing.processes import free_port
from marquardt.trainer._persistence import _files as ckpt

from .conftest import (
    SCRIPTS,
    Processes,
    clean_env,
    read_csv,
    read_json,
    start_srun_tasks,
)

pytestmark = pytest.mark.multiprocess

SEED_ARGS = ["--backend", "gloo", "--compute_setup", "cpu"]
JOB = str(SCRIPTS / "job.py")
#: The reference run: 3 epochs of 8 shuffled steps with metrics reduced over ranks (global
#: batch 8).
REFERENCE = ["--shuffle", "--max-iter", "2", "--all-reduce"]
#: The reference run in 2 processes of batch 4 (spawned by job.py).
TWO_PROCESSES = [JOB, "--nprocs", "2", "--batch-size", "4", *REFERENCE]
#: Rank 1 kills itself (SIGKILL) at step 3; collectives give up on it after 20 s.
KILL_RANK_1 = [
    *("--fault", "sigkill", "--fault-rank", "1", "--fault-step", "3"),
    *("--dist-timeout", "20"),
]


def run_job_here(cwd: Path, *args: str) -> dict[str, Any]:
    """Run scripts/job.py in this process (one training process) and return its JSON."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("marquardt_test_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        module.main([*args, "--out", "here.json"])
    finally:
        os.chdir(previous)
    return read_json(cwd / "here.json")


def _seed_initial_loss() -> float:
    """The full-data loss of the seed's model as seeded.py initialises it (seed 0)."""
    torch.manual_seed(0)
    x = torch.linspace(0, 1, 100).reshape(-1, 1)
    y = torch.sin(2 * torch.pi * x)
    model = nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


def _printed_losses(out: str) -> dict[int, float]:
    """The epoch mean losses PrintMetrics printed, by epoch."""
    found = re.findall(r"^P  0\|cpu    \| Iteration +(\d+)\| Train_Loss: ([0-9.]+) -$", out, re.M)
    return {int(epoch): float(loss) for epoch, loss in found}


def _check_seed_run(cwd: Path, code: int, out: str, err: str, where: str) -> None:
    assert code == 0, f"{out}\n{err}"
    assert f"{where}, world size 2" in out
    losses = _printed_losses(out)  # printed once, by rank 0, every 5 epochs
    assert sorted(losses) == list(range(5, 51, 5)) and out.count("Iteration      50|") == 1
    assert losses[50] < _seed_initial_loss()


def test_seed_script_spawns_two_processes_and_the_loss_falls(
    tmp_path: Path, procs: Processes
) -> None:
    code, out, err = procs.run(
        [str(SCRIPTS / "seeded.py"), "--nprocs", "2", *SEED_ARGS], cwd=tmp_path
    )
    _check_seed_run(tmp_path, code, out, err, "spawn")


def test_seed_script_under_torchrun(tmp_path: Path, procs: Processes) -> None:
    args = [
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(SCRIPTS / "seeded.py"),
        *SEED_ARGS,
    ]
    code, out, err = procs.run(args, cwd=tmp_path)
    _check_seed_run(tmp_path, code, out, err, "torchrun")


def test_seed_script_under_srun_one_task_spawning(tmp_path: Path, procs: Processes) -> None:
    env = clean_env(
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_NODEID="0",
        SLURM_NTASKS="1",
        SLURM_NNODES="1",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_ID=str(free_port()),
        MASTER_PORT=str(free_port()),
    )
    code, out, err = procs.run(
        [str(SCRIPTS / "seeded.py"), "--nprocs", "2", *SEED_ARGS], cwd=tmp_path, env=env
    )
    _check_seed_run(tmp_path, code, out, err, "slurm (one task per node, spawning)")


def test_seed_script_under_srun_one_task_per_process(tmp_path: Path, procs: Processes) -> None:
    started = start_srun_tasks(
        procs,
        [str(SCRIPTS / "seeded.py"), "--nprocs", "2", *SEED_ARGS],
        tmp_path,
        SLURM_NODEID="0",
        SLURM_NNODES="1",
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_JOB_ID="1",
    )
    (code0, out0, err0), (code1, out1, err1) = (procs.wait(p) for p in started)
    assert code1 == 0 and out1 == "", err1
    _check_seed_run(tmp_path, code0, out0, err0, "slurm (one task per process)")


def test_seed_defaults_on_a_cpu_machine_fall_back_to_gloo(tmp_path: Path, procs: Processes) -> None:
    env = clean_env(CUDA_VISIBLE_DEVICES="")  # no GPU visible, whatever the machine has
    code, _, err = procs.run([str(SCRIPTS / "train_seed.py")], cwd=tmp_path, env=env)
    assert code == 0, err
    assert "'nccl' is replaced by 'gloo'" in err


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Uninterrupted runs: 1 process with batch 8, and 2 processes with batch 4 each."""
    root = tmp_path_factory.mktemp("reference")
    procs = Processes()
    try:
        one = run_job_here(root, "--nprocs", "1", "--batch-size", "8", *REFERENCE, "--root", "one")
        two = procs.start([*TWO_PROCESSES, "--out", "two.json", "--root", "two"], cwd=root)
        code, _, err = procs.wait(two)
        assert code == 0, err
        yield {
            "one": one,
            "two": read_json(root / "two.json"),
            "one_csv": read_csv(root / "one" / "metrics.csv"),
            "two_csv": read_csv(root / "two" / "metrics.csv"),
        }
    finally:
        procs.cleanup()


def test_two_processes_match_one_process_on_the_same_global_batch(
    reference: dict[str, Any],
) -> None:
    one = torch.tensor(reference["one"]["params"])
    two = torch.tensor(reference["two"]["params"])  # returned to the spawning parent
    torch.manual_seed(0)
    initial = torch.cat(
        [
            p.detach().reshape(-1)
            for p in nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).parameters()
        ]
    )
    assert float((two - initial).abs().max()) > 1e-2  # the parent got trained weights back
    difference = float((one - two).abs().max())
    print(f"max |w_1proc - w_2proc| = {difference:.3e}")
    assert difference < 1e-5


def test_metrics_are_reduced_over_ranks_and_written_once(reference: dict[str, Any]) -> None:
    # With all_reduce_metrics, the logged loss of 2 ranks of batch 4 is the mean of their
    # batch losses: the loss of the global batch of 8, which one process logs directly.
    one = [float(r["train_loss"]) for r in reference["one_csv"]]
    two = [float(r["train_loss"]) for r in reference["two_csv"]]
    assert len(one) == len(two) == 3  # rank 0 alone wrote: epochs 1, 2, and 2 at the end
    assert max(abs(a - b) for a, b in zip(one, two, strict=True)) < 1e-5


def test_spawned_processes_do_not_outlive_a_killed_parent(tmp_path: Path, procs: Processes) -> None:
    proc = procs.start([JOB, "--nprocs", "2", "--max-iter", "1000000", "--root", "run"], tmp_path)
    deadline = time.monotonic() + 90
    while not (tmp_path / "run" / "metrics.csv").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "training never started"
        time.sleep(0.2)
    children = _children(proc.pid)
    assert len(children) >= 2
    proc.kill()  # the parent only, with SIGKILL: it cannot clean up
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in children)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_sigterm_checkpoints_exits_zero_and_resume_reproduces(
    tmp_path: Path, procs: Processes, reference: dict[str, Any]
) -> None:
    common = [*TWO_PROCESSES, "--out", "resumed.json", "--root", "run"]
    code, out, err = procs.run(
        [*common, "--fault", "sigterm-parent", "--fault-step", "11"], cwd=tmp_path
    )
    assert code == 0, err
    assert "SIGTERM received" in err and "exiting with status 0" in err
    steps = [s for s, _ in ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")]
    assert len(steps) == 1 and 11 <= steps[0] < 24
    assert not (tmp_path / "resumed.json").exists()  # the script did not carry on
    code, out, err = procs.run([*common, "--resume", "latest"], cwd=tmp_path)
    assert code == 0, err
    assert f"resumed from run/checkpoints/{ckpt.checkpoint_name(steps[0])}" in out
    resumed = read_json(tmp_path / "resumed.json")
    difference = abs(resumed["loss"] - reference["two"]["loss"])
    print(f"DDP SIGTERM+resume: |loss - uninterrupted| = {difference:.3e}")
    assert difference < 1e-6
    assert torch.allclose(
        torch.tensor(resumed["params"]), torch.tensor(reference["two"]["params"]), atol=1e-6
    )


def test_a_killed_worker_stops_the_run_with_the_rank_named(
    tmp_path: Path, procs: Processes
) -> None:
    began = time.monotonic()
    code, _, err = procs.run(
        [JOB, "--nprocs", "2", "--max-iter", "100000", *KILL_RANK_1],
        cwd=tmp_path,
        timeout=120,
    )
    assert code != 0
    assert "rank 1 was killed by signal SIGKILL" in err
    assert time.monotonic() - began < 120  # bounded (the wait would have failed otherwise)


def test_a_survivor_without_launcher_exits_nonzero_when_its_peer_dies(
    tmp_path: Path, procs: Processes
) -> None:
    # srun-style, one task per process: nobody kills rank 0 for us, it must notice itself.
    args = [JOB, "--nprocs", "2", "--max-iter", "1000000", *KILL_RANK_1]
    started = start_srun_tasks(procs, args, tmp_path, SLURM_JOB_ID="2")
    code0, _, err0 = procs.wait(started[0], timeout=120)
    code1, _, _ = procs.wait(started[1], timeout=120)
    assert code1 == -9
    assert code0 != 0
    assert "rank 0: a collective failed" in err0 and "HINT" in err0


@pytest.mark.parametrize("loop", ["ddp", "lm"])
def test_kill_and_resume_reproduces_the_uninterrupted_run(
    tmp_path: Path, procs: Processes, loop: str
) -> None:
    """Train 4 epochs of 4 steps straight; train with checkpoints every epoch, SIGKILL at
    step 14 (in a subprocess), resume from step 12 (epoch 2's end) and finish: the same
    final loss."""
    common = [
        "--loop",
        loop,
        "--nprocs",
        "1",
        "--shuffle",
        "--max-iter",
        "3",
        "--batch-size",
        "16",
        "--checkpoint-every",
        "1",
    ]
    code, _, err = procs.run(
        [JOB, *common, "--root", "killed", "--fault", "sigkill", "--fault-step", "14"], cwd=tmp_path
    )
    assert code == -9, err
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "killed" / "checkpoints")][-1] == 12
    resumed = run_job_here(tmp_path, *common, "--root", "killed", "--resume", "latest")
    straight = run_job_here(tmp_path, *common, "--root", "straight")
    difference = abs(straight["loss"] - resumed["loss"])
    print(f"{loop} kill+resume: |loss - uninterrupted| = {difference:.3e}")
    assert resumed["step"] == 16 and difference < 1e-6
    assert torch.allclose(
        torch.tensor(resumed["params"]), torch.tensor(straight["params"]), atol=1e-6
    )


def test_early_stopping_killed_and_resumed_stops_where_the_uninterrupted_run_does(
    tmp_path: Path, procs: Processes
) -> None:
    """EarlyStopping's best value and count of validations without improvement survive a
    SIGKILL: the resumed run stops at the step, and with the best value, of the run that was
    never interrupted (with its state forgotten it would stop several validations later)."""
    common = [
        *("--nprocs", "1", "--shuffle", "--batch-size", "16", "--max-iter", "300"),
        *("--val-every", "4", "--patience", "3", "--min-delta", "1e-3"),
        *("--checkpoint-every", "1"),
    ]
    straight = run_job_here(tmp_path, *common, "--root", "straight")
    stop = straight["stopped_at"]  # an epoch (4 steps each)
    assert stop is not None and straight["epoch"] == stop < 300
    kill = (stop - 2) * 4 + 2  # in epoch stop - 2, after the validation without improvement
    code, _, err = procs.run(
        [JOB, *common, "--root", "killed", "--fault", "sigkill", "--fault-step", str(kill)],
        cwd=tmp_path,
    )
    assert code == -9, err
    last_step, last = ckpt.list_checkpoints(tmp_path / "killed" / "checkpoints")[-1]
    assert last_step == (stop - 2) * 4  # the end of epoch stop - 3
    saved = ckpt.read_checkpoint(last)["callbacks"][0]
    (early,) = [v["state"] for k, v in saved.items() if k.startswith("EarlyStopping")]
    assert early["bad_validations"] >= 1  # the state matters: forgetting it moves the stop
    resumed = run_job_here(tmp_path, *common, "--root", "killed", "--resume", "latest")
    print(f"early stopping: straight {stop}, resumed {resumed['stopped_at']}")
    assert resumed["epoch"] == resumed["stopped_at"] == stop
    assert resumed["best"] == straight["best"]


STREAM = str(SCRIPTS / "stream.py")


def _stream_run(cwd: Path, procs: Processes, *args: str) -> list[list[tuple[int, list[int]]]]:
    """Run scripts/stream.py in 2 processes; per rank, the (epoch, items) of every step."""
    # dist_timeout 20 s: a rank left waiting in a collective fails the run, not the test
    # runner; the 120 s wait is the test's own bound on a hang.
    code, _, err = procs.run([STREAM, "--nprocs", "2", *args], cwd=cwd, timeout=120)
    assert code == 0, err
    runs = [read_json(cwd / f"seen_{rank}.json") for rank in (0, 1)]
    return [[(int(e), list(b)) for e, b in run["seen"]] for run in runs]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_is_split_over_ranks_and_workers_disjointly(
    tmp_path: Path, procs: Processes, workers: int
) -> None:
    """40 items, 2 ranks of ``workers`` loader workers: each rank sees its own items (item i
    goes to slot i mod 2n, slot s belonging to rank s // n), and the ranks' items together
    are the whole stream, in every pass. A stream has no length: an epoch is one batch (as
    perceptrain's infinite datasets), and a rank's stream starts again when it ends."""
    slots = 2 * max(workers, 1)
    per_pass = 5 if workers == 0 else 6  # batches of 4 per rank (per worker: 10 = 4+4+2)
    passes = 2 if workers == 0 else 1
    epochs = passes * per_pass
    seen = _stream_run(
        tmp_path,
        procs,
        *("--items", "40", "--workers", str(workers), "--max-iter", str(epochs - 1)),
    )
    assert [[e for e, _ in steps] for steps in seen] == [list(range(epochs))] * 2
    for index in range(passes):
        part = slice(index * per_pass, (index + 1) * per_pass)
        items = [[i for _, batch in steps[part] for i in batch] for steps in seen]
        assert sorted(items[0] + items[1]) == list(range(40))  # disjoint, and the whole stream
        for rank in (0, 1):
            assert {i % slots // max(workers, 1) for i in items[rank]} == {rank}


@pytest.mark.parametrize(
    "args,per_pass",
    [
        # 33 items over 2 ranks: 17 items (5 batches) on rank 0, 16 (4 batches) on rank 1.
        (["--items", "33"], (5, 4)),
        # A dataset that shards itself: rank 0 has 20 items (5 batches), rank 1 10 (3).
        (["--items", "40", "--self-sharding"], (5, 3)),
    ],
    ids=["trainer-sharded", "self-sharded"],
)
def test_ranks_whose_streams_end_apart_train_every_epoch(
    tmp_path: Path, procs: Processes, args: list[str], per_pass: tuple[int, int]
) -> None:
    seen = _stream_run(tmp_path, procs, *args, "--max-iter", "9")
    for rank, steps in enumerate(seen):
        assert [e for e, _ in steps] == list(range(10))  # one batch an epoch, none hung
        batches = [batch for _, batch in steps]
        n = per_pass[rank]
        assert batches[n] == batches[0]  # the rank's stream started again after its end
    if "--self-sharding" in args:
        assert {i % 2 for _, batch in seen[1] for i in batch} == {1}  # its own split was kept
