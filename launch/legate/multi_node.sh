#!/usr/bin/env bash
# The LM tutorial on several nodes: Legate's own launcher starts one rank per node
# (srun or mpirun) and spreads the solver's arrays over every rank's GPUs.
#
#   NODES=2 LEGATE_GPUS=3 bash launch/legate/multi_node.sh          # inside a 2-node allocation
#   NODES=2 LAUNCHER=mpirun bash launch/legate/multi_node.sh        # under mpirun instead
#
# NOTE: multi-node Legate needs the conda build of Legate and cuPyNumeric (conda-forge and
# the legate channel), which carries the networking layer (GASNet-EX or UCX). The PyPI
# wheels run on one node only: they have no networking, and `--nodes 2` fails at start.
#
# Extra arguments are passed to the script.
set -euo pipefail

SCRIPT=${SCRIPT:-examples/sinc_lm.py}  # the LM script (LMA with get_available_gpus())
NODES=${NODES:-${SLURM_JOB_NUM_NODES:-2}}
LAUNCHER=${LAUNCHER:-srun}              # srun inside Slurm; mpirun elsewhere
LEGATE_GPUS=${LEGATE_GPUS:-3}           # solver GPUs per node; the rest of a node's GPUs go to the model
FBMEM=${FBMEM:-14000}                   # MiB of memory per Legate GPU
SYSMEM=${SYSMEM:-16000}                 # MiB of host memory per rank

# One rank per node; Legate distributes cuPyNumeric's arrays (J or JtJ) and the solve over
# the GPUs of every rank.
exec legate --nodes "$NODES" --ranks-per-node 1 --launcher "$LAUNCHER" \
    --gpus "$LEGATE_GPUS" --fbmem "$FBMEM" --sysmem "$SYSMEM" "$SCRIPT" "$@"
