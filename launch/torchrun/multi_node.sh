#!/usr/bin/env bash
# DDP on several nodes with torchrun and the c10d rendezvous: run this same command on every
# node (by hand, pdsh, or srun); the agents meet at HEAD_NODE:RDZV_PORT and agree on ranks.
#
#   HEAD_NODE=node001 NNODES=2 GPUS_PER_NODE=4 bash launch/torchrun/multi_node.sh   # on each node
#
# Extra arguments are passed to the training script.
set -euo pipefail

SCRIPT=${SCRIPT:-train.py}            # the training script (TrainConfig/Trainer)
COMPUTE_SETUP=${COMPUTE_SETUP:-auto}  # cpu | gpu | auto
BACKEND=${BACKEND:-nccl}              # nccl on GPUs, gloo on CPUs
NNODES=${NNODES:-2}                   # nodes taking part (a range MIN:MAX makes it elastic)
GPUS_PER_NODE=${GPUS_PER_NODE:-1}     # workers per node: one per GPU
HEAD_NODE=${HEAD_NODE:-$(hostname)}   # host (or IP) of the node that holds the rendezvous store
RDZV_PORT=${RDZV_PORT:-29501}         # a free TCP port on HEAD_NODE
RDZV_ID=${RDZV_ID:-marquardt}         # the same on every node; unique per job
# Extra rendezvous options, e.g. RDZV_CONF=is_host=1 on the head node when torchrun cannot
# tell from names and addresses that it is the head (a host name on 127.0.1.1).
RDZV_CONF=${RDZV_CONF:-}
rdzv_conf=()
if [[ -n $RDZV_CONF ]]; then rdzv_conf=(--rdzv_conf "$RDZV_CONF"); fi

# Threads per worker: torchrun alone would give each 1 (OMP_NUM_THREADS=1); the thread
# rule gives each the cores this agent may use (affinity, cgroup quota, SLURM_CPUS_PER_TASK)
# over the workers of its node. An OMP_NUM_THREADS you set wins.
threads=$(marquardt-devices --threads "$GPUS_PER_NODE" 2>/dev/null || echo 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}

# The agent on HEAD_NODE hosts the c10d store; the others connect to it. No node rank is
# given: the rendezvous assigns them.
exec torchrun --nnodes "$NNODES" --nproc_per_node "$GPUS_PER_NODE" \
    --rdzv_id "$RDZV_ID" --rdzv_backend c10d --rdzv_endpoint "$HEAD_NODE:$RDZV_PORT" \
    "${rdzv_conf[@]}" \
    "$SCRIPT" --compute_setup "$COMPUTE_SETUP" --backend "$BACKEND" "$@"
