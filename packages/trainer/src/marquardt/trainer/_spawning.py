"""A spawn: this process starts the training processes, waits, and takes the result back.

Used when nothing launched the run (``python train.py`` with ``nprocs > 1``) or when each
Slurm task spawns its share. The trainer's pieces are pickled once and sent to every
child (started with ``torch.multiprocessing``, method ``spawn``, which is safe with
CUDA); SIGTERM is forwarded to them; when one dies the others are stopped and the error
names the rank that failed first; and rank 0's trained state comes back into the caller's
model and optimizer (:mod:`marquardt.trainer._handback`).
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.multiprocessing as mp
from torch import nn

from . import _distributed as pg
from ._config import TrainConfig
from ._environments import LaunchEnvironment, ProcessLayout
from ._errors import ConfigError, WorkerFailedError
from ._handback import OptimizerSpec, apply_result, read_result
from ._logging import notice
from ._plan import RunPlan, plan_run
from ._resume import check_resume
from ._signals import SignalForwarder, exit_with_parent
from ._state import TrainerState
from ._worker import PEER_FAILED_EXIT, run_worker

if TYPE_CHECKING:
    from ._trainer import Trainer


@dataclass
class _SpawnPayload:
    """Everything a spawned process needs to rebuild the trainer, pickled once for all."""

    model: nn.Module
    optimizer: OptimizerSpec
    config: TrainConfig
    loss_fn: Any
    optimize_step: Any
    train_loader: Any
    val_loader: Any
    plan: RunPlan
    result_path: str
    use_gpu: bool
    backend: str
    gpu_count: int
    environment_name: str


def fit_spawn(
    trainer: Trainer, env: LaunchEnvironment, train_loader: Any, val_loader: Any
) -> tuple[nn.Module, Any]:
    """Train in ``env.layouts()`` new processes; return the caller's model and optimizer."""
    for text in trainer.compute.notices:
        notice(text)
    plan = plan_run(trainer.config)
    check_resume(trainer, plan)
    layouts = env.layouts()
    workdir = tempfile.mkdtemp(prefix="marquardt-spawn-")
    result_path = os.path.join(workdir, "result.pt")
    payload = _SpawnPayload(
        model=trainer.model,
        optimizer=OptimizerSpec.capture(trainer.optimizer, trainer.model),
        config=trainer.config,
        loss_fn=trainer.loss_fn,
        optimize_step=trainer.optimize_step,
        train_loader=train_loader,
        val_loader=val_loader,
        plan=plan,
        result_path=result_path,
        use_gpu=trainer.compute.use_gpu,
        backend=trainer.compute.backend,
        gpu_count=trainer.gpu_count,
        environment_name=env.name,
    )
    try:
        # Plain pickle copies tensors (torch's own reducer would share the caller's
        # storage with every child, which would then all write to it).
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise ConfigError(
            f"{env.name}: the model, optimizer, loss, callbacks and loaders are sent to "
            f"{len(layouts)} new processes, but one of them cannot be pickled "
            f"({type(exc).__name__}: {exc}). HINT: define functions and classes at module "
            "level (no lambdas or local classes), and keep the training code under "
            "if __name__ == '__main__':"
        ) from exc
    try:
        _join_spawned(data, layouts)
        result = read_result(result_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    # The caller's objects get the trained state (rank 0's, identical on every rank).
    apply_result(trainer, result)
    if trainer.state.interrupted:
        notice(
            f"{env.name}: training stopped by SIGTERM at step {trainer.state.step}; the "
            "checkpoint is written, exiting with status 0 (resume with "
            "resume_from='latest')"
        )
        raise SystemExit(0)
    return trainer.model, trainer.optimizer


def _join_spawned(data: bytes, layouts: list[ProcessLayout]) -> None:
    """Start one process per layout, forward SIGTERM to them and wait; none outlives this."""
    context = mp.start_processes(
        _spawn_entry,
        args=(data, layouts),
        nprocs=len(layouts),
        join=False,
        start_method="spawn",
    )
    forwarder = SignalForwarder(lambda: [p.pid for p in context.processes if p.is_alive()])
    forwarder.install()
    try:
        while not context.join(timeout=0.5):
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        raise _spawn_failure(context, layouts, exc) from None
    finally:
        forwarder.uninstall()
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)


def _spawn_failure(context: Any, layouts: list[ProcessLayout], exc: Exception) -> WorkerFailedError:
    """The error naming the rank that failed first, how, and every rank's exit status."""
    codes = {layouts[i].rank: p.exitcode for i, p in enumerate(context.processes)}
    index = getattr(exc, "error_index", 0)
    culprit = layouts[index].rank
    # Prefer a process that died on its own (a signal it did not get from us, or an
    # error) over one that only stopped because its peer was gone.
    for i, code in sorted(codes.items()):
        if code not in (0, None, PEER_FAILED_EXIT, -15):
            culprit = i
            break
    code = codes.get(culprit)
    if isinstance(code, int) and code < 0:
        try:
            how = f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with status {code}"
    detail = ""
    if isinstance(exc, mp.ProcessRaisedException):
        detail = f"\n--- traceback of rank {layouts[index].rank} ---\n{exc}"
    return WorkerFailedError(
        f"spawn: rank {culprit} {how}; the other training processes were stopped "
        f"(exit statuses by rank: {codes}). HINT: rank {culprit}'s output above says why; "
        f"a kill by SIGKILL is often the out-of-memory killer{detail}",
        rank=culprit,
    )


def _spawn_entry(index: int, data: bytes, layouts: list[ProcessLayout]) -> None:
    """A spawned training process: rebuild the trainer from the payload and train."""
    exit_with_parent()
    # Imported here: the Trainer module imports this one (for fit), so a top-level import
    # would be circular; the child process needs the class only to rebuild the trainer.
    from ._trainer import Trainer

    payload: _SpawnPayload = pickle.loads(data)
    trainer = Trainer.__new__(Trainer)
    trainer.config = payload.config
    trainer.model = payload.model
    trainer.optimizer = payload.optimizer.build(payload.model)
    trainer.is_lm = False
    trainer.loss_fn = payload.loss_fn
    trainer.optimize_step = payload.optimize_step
    trainer.gpu_count = payload.gpu_count
    trainer.compute = pg.Compute(use_gpu=payload.use_gpu, backend=payload.backend)
    trainer.environment = None
    trainer.state = TrainerState()
    trainer._environment_name = payload.environment_name
    layout = layouts[index]
    # A lost peer ends this process inside run_worker with PEER_FAILED_EXIT, which tells
    # the parent this rank is not the culprit.
    run_worker(
        trainer,
        layout,
        payload.plan,
        payload.result_path if index == 0 else None,
        payload.train_loader,
        payload.val_loader,
        env_init=False,
    )
