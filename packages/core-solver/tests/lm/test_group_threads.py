"""LMA over a gloo group of 2 processes on CPUs: each rank runs the devices' thread rule
(the cores over the ranks on this host), unless the rank set its own count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from marquardt.devices import cpu_budget

pytestmark = pytest.mark.multiprocess

RANK = """
import json, sys
from datetime import timedelta
import torch
import torch.distributed as dist
from marquardt.devices import applied_threads
from marquardt.solver import LMA

rank, store, own = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "own"
wanted = torch.get_num_threads() + 1  # never torch's default, so the rank's own
if own:
    torch.set_num_threads(wanted)
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                        timeout=timedelta(seconds=60))
model = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
LMA(model, ["cpu"], residual_fn=lambda a, b: a - b, process_group="default")
choice = applied_threads()
print(json.dumps({"threads": torch.get_num_threads(), "wanted": wanted,
                  "source": None if choice is None else choice.source,
                  "processes": None if choice is None else choice.processes}))
dist.destroy_process_group()
"""


def _ranks(tmp_path: Path, own: str) -> list[dict[str, object]]:
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LOCAL_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in names and not k.startswith("SLURM_")}
    store = str(tmp_path / f"store{own}")
    command = [sys.executable, "-c", RANK]
    pipe = subprocess.PIPE
    procs = [
        subprocess.Popen(
            [*command, str(rank), store, own], env=env, stdout=pipe, stderr=pipe, text=True
        )
        for rank in (0, 1)
    ]
    outs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_each_rank_gets_its_share_of_the_cores(tmp_path: Path) -> None:
    share = max(1, cpu_budget(env={}).cores // 2)
    for rank in _ranks(tmp_path, "rule"):
        assert (rank["threads"], rank["source"], rank["processes"]) == (share, "rule", 2)


def test_a_ranks_own_count_is_kept(tmp_path: Path) -> None:
    for rank in _ranks(tmp_path, "own"):
        assert rank["threads"] == rank["wanted"] and rank["source"] == "torch.set_num_threads"
