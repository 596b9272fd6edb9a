"""The torchrun recipes, for real: 2 worker processes on CPU with gloo."""

from __future__ import annotations

import subprocess
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
    losses,
    run,
    start,
    wait_all,
)
from marquardt.testing.processes import free_port

pytestmark = pytest.mark.multiprocess
CPU = {"COMPUTE_SETUP": "cpu", "BACKEND": "gloo"}


def test_single_node_two_workers_fit(tmp_path: Path) -> None:
    env = base_env({**CPU, "NPROCS": "2", "SCRIPT": str(FIT)})
    done = run(["bash", str(LAUNCH / "torchrun" / "single_node.sh")], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.describe()
    assert_trained(done.output, world_size=2, epochs=60, print_every=10)
    assert describe_lines(done.output)[0]["where"] == "torchrun"
    ranks = assert_ranks(done.output, 2)
    assert sorted(r.local_rank for r in ranks) == [0, 1]


def test_single_node_runs_the_seed_script(tmp_path: Path) -> None:
    """The seeds' train.py (imports changed only) under the recipe: epochs 0-50, printed by
    rank 0 every 5."""
    env = base_env({**CPU, "NPROCS": "2", "SCRIPT": str(SEED_TRAIN)})
    done = run(["bash", str(LAUNCH / "torchrun" / "single_node.sh")], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.describe()
    head = describe_lines(done.output)
    assert len(head) == 1 and head[0]["where"] == "torchrun" and head[0]["world"] == "2", head
    assert [s for s, _ in losses(done.output)] == list(range(5, 51, 5)), done.output


def _head_address() -> str:
    """This machine's first address as `hostname -I` gives it (as the Slurm recipes do)."""
    done = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10)
    words = done.stdout.split()
    return words[0] if done.returncode == 0 and words else "127.0.0.1"


def test_multi_node_two_agents_meet_through_c10d(tmp_path: Path) -> None:
    """Two torchrun agents ("nodes") of one worker each meet at one c10d endpoint.

    Both run on this machine, but they are separate agents that find each other only
    through the rendezvous, as on two nodes: world size 2 from NNODES=2 x GPUS_PER_NODE=1.
    The endpoint is the address of `hostname -I`, which this machine's host name does not
    resolve to, so the head is named explicitly (RDZV_CONF=is_host=1/0), as the recipe's
    notes advise.
    """
    port = free_port()
    common = {
        **CPU, "SCRIPT": str(FIT), "NNODES": "2", "GPUS_PER_NODE": "1",
        "HEAD_NODE": _head_address(), "RDZV_PORT": str(port), "RDZV_ID": f"it-{port}",
    }  # fmt: skip
    cmd = ["bash", str(LAUNCH / "torchrun" / "multi_node.sh")]
    procs = [
        start(cmd, env=base_env({**common, "RDZV_CONF": f"is_host={head}"}), cwd=tmp_path)
        for head in (1, 0)
    ]
    first, second = wait_all(procs, [cmd, cmd], timeout=300)
    assert first.returncode == 0, first.describe()
    assert second.returncode == 0, second.describe()
    both = first.output + second.output
    assert_trained(both, world_size=2, epochs=60, print_every=10)
    ranks = assert_ranks(both, 2)
    # One worker per agent: each is local rank 0 of its own "node".
    assert [r.local_rank for r in ranks] == [0, 0]
