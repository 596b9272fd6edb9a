"""Every environment variable that ``marquardt.trainer`` reads, with its meaning.

Nothing else in the package reads ``os.environ`` for launch decisions: the launch
environments receive a plain mapping (``os.environ`` by default), so they can be tested
from dictionaries, and a value a launcher set before ``fit`` is honoured. Variables are
read when asked, never at import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: name -> meaning. The environments only read names listed here (see ``get``).
ENVIRONMENT: dict[str, str] = {
    # torchrun / torch.distributed.elastic
    "TORCHELASTIC_RUN_ID": "set by torchrun in every worker: the run is launched by torchrun",
    "RANK": "global rank of this process (torchrun)",
    "LOCAL_RANK": "rank of this process on its node (torchrun)",
    "WORLD_SIZE": "number of processes in the job (torchrun)",
    "LOCAL_WORLD_SIZE": "number of processes on this node (torchrun)",
    "GROUP_RANK": "rank of this node among the nodes (torchrun)",
    "MASTER_ADDR": (
        "host of the rendezvous store; set by torchrun, derived from SLURM_JOB_NODELIST under "
        "srun, 127.0.0.1 for a spawn; a value set by the user wins under srun and spawn"
    ),
    "MASTER_PORT": (
        "port of the rendezvous store; set by torchrun, derived from SLURM_JOB_ID under srun, "
        "a free port for a spawn; a value set by the user wins under srun and spawn"
    ),
    # Slurm (srun)
    "SLURM_PROCID": "global rank of this task under srun (its presence means: launched by srun)",
    "SLURM_LOCALID": "rank of this task on its node under srun",
    "SLURM_NODEID": "rank of this task's node among the step's nodes",
    "SLURM_NTASKS": "number of tasks of the job (used when SLURM_STEP_NUM_TASKS is unset)",
    "SLURM_STEP_NUM_TASKS": "number of tasks of this srun step",
    "SLURM_NNODES": "number of nodes of the job (used when SLURM_STEP_NUM_NODES is unset)",
    "SLURM_STEP_NUM_NODES": "number of nodes of this srun step",
    "SLURM_JOB_NODELIST": "compressed host list of the job, e.g. node[01-03,07]",
    "SLURM_STEP_NODELIST": "compressed host list of this step (preferred over the job's)",
    "SLURM_STEP_TASKS_PER_NODE": "tasks per node of this step, e.g. 2(x3),1",
    "SLURM_JOB_ID": "job id; the rendezvous port is derived from it so every task agrees",
    "SLURM_RESTART_COUNT": (
        "how often Slurm requeued the job; > 0 makes resume_from=None mean 'latest', so a "
        "requeued run resumes from the checkpoint its SIGTERM wrote"
    ),
    # devices
    "CUDA_VISIBLE_DEVICES": "which GPUs this process may use (read through marquardt.devices)",
    "LEGATE_CONFIG": "flags of the Legate runtime; its presence means the script runs under Legate",
    # MLflow (read by MLflowLogger when it was given no tracking_uri / experiment)
    "MLFLOW_TRACKING_URI": (
        "the MLflow tracking store of tracking_tool='mlflow', as in perceptrain (default: "
        "./mlruns in the working directory; MLflowLogger(in_run_folder=True): <run folder>/mlruns)"
    ),
    "MLFLOW_EXPERIMENT_NAME": "the MLflow experiment of tracking_tool='mlflow' (default: marquardt)",
    # the trainer's own
    "MARQUARDT_TRAINER_DIST_TIMEOUT": (
        "seconds a collective may wait for a peer before the process group fails; overrides "
        "TrainConfig.dist_timeout (useful to shorten it on a cluster without editing code)"
    ),
}


def get(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of a documented variable in ``env`` (``os.environ`` by default), or None.

    A single accessor keeps ``ENVIRONMENT`` honest: asking for an undocumented name is
    a programming error.
    """
    if name not in ENVIRONMENT:
        raise KeyError(f"{name} is not a documented setting of marquardt.trainer")
    source = os.environ if env is None else env
    value = source.get(name)
    return None if value is None or value.strip() == "" else value.strip()


def get_int(name: str, env: Mapping[str, str] | None = None) -> int | None:
    """A documented variable read as an integer; a malformed value is a clear error."""
    value = get(name, env)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={value!r} is not an integer. "
            f"HINT: unset it or set it to a whole number ({ENVIRONMENT[name]})"
        ) from None


def dist_timeout_override(env: Mapping[str, str] | None = None) -> float | None:
    """``MARQUARDT_TRAINER_DIST_TIMEOUT`` in seconds, if set (must be > 0)."""
    value = get("MARQUARDT_TRAINER_DIST_TIMEOUT", env)
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(
            f"MARQUARDT_TRAINER_DIST_TIMEOUT={value!r} is not a positive number of seconds. "
            "HINT: e.g. MARQUARDT_TRAINER_DIST_TIMEOUT=120"
        )
    return seconds
