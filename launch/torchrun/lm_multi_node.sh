#!/usr/bin/env bash
# LM over torch.distributed on one or several nodes with torchrun: each worker computes the
# Jacobian products of its share of the batch and the workers all-reduce them (LMA with
# process_group="default"). Run this same command on every node; the agents meet at
# HEAD_NODE:RDZV_PORT and agree on ranks.
#
#   HEAD_NODE=node001 NNODES=2 NPROC_PER_NODE=4 bash launch/torchrun/lm_multi_node.sh   # each node
#   NNODES=1 NPROC_PER_NODE=2 BACKEND=gloo bash launch/torchrun/lm_multi_node.sh        # CPU, 1 node
#
# Extra arguments are passed to the LM script.
set -euo pipefail

SCRIPT=${SCRIPT:-examples/lm_distributed.py}  # an LM script calling LMA(..., process_group="default")
BACKEND=${BACKEND:-auto}              # nccl on GPUs, gloo on CPUs (auto: nccl when CUDA is there)
NNODES=${NNODES:-2}                   # nodes taking part
NPROC_PER_NODE=${NPROC_PER_NODE:-1}   # workers per node: one per GPU (or per CPU socket)
HEAD_NODE=${HEAD_NODE:-$(hostname)}   # host (or IP) of the node that holds the rendezvous store
RDZV_PORT=${RDZV_PORT:-29502}         # a free TCP port on HEAD_NODE
RDZV_ID=${RDZV_ID:-marquardt-lm}      # the same on every node; unique per job
# Extra rendezvous options, e.g. RDZV_CONF=is_host=1 on the head node when torchrun cannot
# tell from names and addresses that it is the head (a host name on 127.0.1.1).
RDZV_CONF=${RDZV_CONF:-}
rdzv_conf=()
if [[ -n $RDZV_CONF ]]; then rdzv_conf=(--rdzv_conf "$RDZV_CONF"); fi
# Threads per worker: torchrun alone would give each 1 (OMP_NUM_THREADS=1); the thread
# rule gives each the cores this agent may use (affinity, cgroup quota, SLURM_CPUS_PER_TASK)
# over the workers of its node. An OMP_NUM_THREADS you set wins.
threads=$(marquardt-devices --threads "$NPROC_PER_NODE" 2>/dev/null || echo 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}

# The agent on HEAD_NODE hosts the c10d store; the others connect to it.
exec torchrun --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" \
    --rdzv_id "$RDZV_ID" --rdzv_backend c10d --rdzv_endpoint "$HEAD_NODE:$RDZV_PORT" \
    "${rdzv_conf[@]}" \
    "$SCRIPT" --backend "$BACKEND" "$@"
