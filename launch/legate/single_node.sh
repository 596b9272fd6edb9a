#!/usr/bin/env bash
# The LM tutorial on one node under Legate. Legate takes LEGATE_GPUS GPUs for the solver
# (cuPyNumeric); the model side (PyTorch) takes the GPUs left (get_available_gpus()).
#
#   bash launch/legate/single_node.sh                    # K, --fbmem, --sysmem from marquardt-devices
#   LEGATE_GPUS=3 bash launch/legate/single_node.sh      # 4 GPUs: 3 for the solver, 1 for the model
#   LEGATE_GPUS=0 LEGATE_CPUS=2 bash launch/legate/single_node.sh   # no GPU: the solver on 2 CPUs
#
# Extra arguments are passed to the script.
set -euo pipefail

SCRIPT=${SCRIPT:-examples/sinc_lm.py}  # the LM script (LMA with get_available_gpus())
PARAMS=${PARAMS:-193}                   # model parameters P, for the plan
BATCH=${BATCH:-10000}                   # samples per LM step N, for the plan
SYSMEM=${SYSMEM:-}                      # MiB of host memory for Legate (per rank)
FBMEM=${FBMEM:-}                        # MiB of memory per Legate GPU
LEGATE_CPUS=${LEGATE_CPUS:-1}           # Legate CPU processors when it has no GPU

if [[ -z ${LEGATE_GPUS:-} ]]; then
    # marquardt-devices sizes the split from NVML (without touching CUDA) and prints the
    # command it recommends: "legate --gpus K --fbmem F --sysmem S script ..." on GPUs.
    plan=$(marquardt-devices --params "$PARAMS" --batch "$BATCH" --script "$SCRIPT")
    LEGATE_GPUS=$(sed -n 's/^Recommendation:.*Legate GPUs=\([0-9]*\).*/\1/p' <<<"$plan")
    FBMEM=${FBMEM:-$(sed -n 's/.*legate .*--fbmem \([0-9]*\).*/\1/p' <<<"$plan")}
    SYSMEM=${SYSMEM:-$(sed -n 's/.*legate .*--sysmem \([0-9]*\).*/\1/p' <<<"$plan")}
    echo "marquardt-devices recommends ${LEGATE_GPUS:-?} Legate GPU(s)"
fi
LEGATE_GPUS=${LEGATE_GPUS:-0}

args=(--sysmem "${SYSMEM:-4000}")
if ((LEGATE_GPUS > 0)); then
    args+=(--gpus "$LEGATE_GPUS")
    if [[ -n $FBMEM ]]; then args+=(--fbmem "$FBMEM"); fi
else
    # No GPU for Legate: cuPyNumeric runs on CPU processors; the model stays on the CPU.
    args+=(--gpus 0 --cpus "$LEGATE_CPUS")
    # torch's threads: the cores left beside Legate's CPU processors (the thread rule, one
    # process); an OMP_NUM_THREADS you set wins.
    threads=$(LEGATE_CONFIG="--cpus $LEGATE_CPUS" marquardt-devices --threads 1 2>/dev/null || echo 1)
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
    # The solver's "auto" backend picks cuPyNumeric only when Legate holds GPUs; under
    # legate on CPUs, ask for it (MARQUARDT_SOLVER_BACKEND=torch keeps the solve in torch).
    export MARQUARDT_SOLVER_BACKEND=${MARQUARDT_SOLVER_BACKEND:-cupynumeric}
fi
echo "legate ${args[*]} $SCRIPT $*"
exec legate "${args[@]}" "$SCRIPT" "$@"
