"""Fit y = sinc(10x) with Levenberg-Marquardt over every process of a torch.distributed job.

Each step draws one global batch of ``--batch`` samples (the same draw on every rank, from
a shared seed), and each rank passes its contiguous share of it to
``LMA(..., process_group="default").step``: the ranks compute the Jacobian products of
their own rows and all-reduce them, so the run takes the steps one process would take on
the whole batch. Launch it with torchrun (one process per GPU, or ``--nproc-per-node`` CPU
workers with gloo), on one node or many:

    torchrun --nproc-per-node 2 examples/lm_distributed.py --backend gloo
    bash launch/torchrun/lm_multi_node.sh          # on each node
    sbatch launch/slurm/lm_multi_node.sbatch       # Slurm: one torchrun agent per node

Without torchrun (no ``WORLD_SIZE`` in the environment) it runs in one process, with
``process_group=None``. Rank 0 prints each step's loss, λ, attempts and the seconds spent
in the collective; every rank prints one ``lm-rank:`` line at the end (its λ and Σθ, which
agree across ranks) and rank 0 a ``lm-summary:`` line.
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from marquardt.solver import LMA

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=30, help="LM steps (default 30)")
parser.add_argument("--batch", type=int, default=4000, help="global batch size (default 4000)")
parser.add_argument("--hidden", type=int, default=32, help="tanh units (default 32)")
parser.add_argument(
    "--backend", default="auto", choices=["auto", "gloo", "nccl"], help="collectives backend"
)
parser.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds")
parser.add_argument("--seed", type=int, default=0, help="random seed (the same on every rank)")
args = parser.parse_args()

distributed = "WORLD_SIZE" in os.environ
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
use_cuda = torch.cuda.is_available() and args.backend != "gloo"
device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
if distributed:
    backend = args.backend if args.backend != "auto" else ("nccl" if use_cuda else "gloo")
    # Before the group: imported later (torch.func does, for custom modules) it would keep
    # the group alive past its destruction (docs/lm-many-nodes.md, "Faults and checks").
    import torch._dynamo

    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
rank = dist.get_rank() if distributed else 0
world = dist.get_world_size() if distributed else 1

torch.manual_seed(args.seed)
model = nn.Sequential(nn.Linear(1, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1)).to(device)
lma = LMA(
    model,
    [device],
    residual_fn=lambda a, b: a - b,
    process_group="default" if distributed else None,
)

x_all = torch.linspace(-1, 1, 100_000).unsqueeze(1)
y_all = torch.sinc(10 * x_all)
draw = torch.Generator().manual_seed(args.seed)  # the same global batches on every rank
share = args.batch // world
first = last = float("nan")
for step in range(1, args.steps + 1):
    index = torch.randperm(len(x_all), generator=draw)[: share * world]
    mine = index[rank * share : (rank + 1) * share]
    loss, terminated = lma.step(x_all[mine].to(device), y_all[mine].to(device))
    report = lma.report
    assert report is not None
    if step == 1:
        first = report.loss_before
    last = loss
    if rank == 0:
        print(
            f"step {step:3d}  loss {loss:.4e}  damping {lma.damping:.1e}  attempts "
            f"{report.attempts}  collective {report.seconds_collective * 1e3:7.1f} ms  "
            f"step {report.seconds_total * 1e3:7.1f} ms",
            flush=True,
        )
    if terminated:
        break

theta = torch.nn.utils.parameters_to_vector(lma.model.parameters()).double().sum().item()
print(f"lm-rank: rank {rank} world {world} damping {lma.damping!r} theta-sum {theta!r}", flush=True)
if rank == 0:
    print(f"lm-summary: world {world} steps {lma.steps} first {first:.6e} last {last:.6e}")
if distributed:
    dist.barrier()  # no rank tears the group down while another still talks to it
    dist.destroy_process_group()
