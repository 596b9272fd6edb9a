#!/usr/bin/env bash
# DDP on one node with torchrun: one worker per GPU; torchrun sets every rank.
#
#   bash launch/torchrun/single_node.sh                           # all GPUs of this node, nccl
#   NPROCS=2 COMPUTE_SETUP=cpu BACKEND=gloo bash launch/torchrun/single_node.sh   # 2 CPU workers
#
# Extra arguments are passed to the training script.
set -euo pipefail

SCRIPT=${SCRIPT:-train.py}            # the training script (TrainConfig/Trainer)
COMPUTE_SETUP=${COMPUTE_SETUP:-auto}  # cpu | gpu | auto
BACKEND=${BACKEND:-nccl}              # nccl on GPUs, gloo on CPUs
# GPUs of this node as nvidia-smi lists them (0 without a driver).
GPUS_PER_NODE=${GPUS_PER_NODE:-$({ nvidia-smi -L 2>/dev/null || true; } | grep -c '^GPU ' || true)}
# One worker per GPU; at least one worker on a machine without GPU.
NPROCS=${NPROCS:-$((GPUS_PER_NODE > 0 ? GPUS_PER_NODE : 1))}

# Threads per worker: torchrun alone would give each 1 (OMP_NUM_THREADS=1); the thread
# rule gives each the cores this agent may use (affinity, cgroup quota, SLURM_CPUS_PER_TASK)
# over the workers of its node. An OMP_NUM_THREADS you set wins.
threads=$(marquardt-devices --threads "$NPROCS" 2>/dev/null || echo 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}

# --standalone: a private c10d rendezvous on a free local port (no clash between jobs).
# torchrun gives the world size, so the script keeps its default --nprocs.
exec torchrun --standalone --nnodes 1 --nproc_per_node "$NPROCS" \
    "$SCRIPT" --compute_setup "$COMPUTE_SETUP" --backend "$BACKEND" "$@"
