"""A spawn: this process starts the training processes, waits, and takes the result back.

Used when nothing launched the run (``python train.py`` with ``nprocs > 1``) or when each
Slurm task spawns its share. A ``WorkerSpec`` is pickled once and sent to
every child (started with ``torch.multiprocessing``, method ``spawn``, which is safe with
CUDA), which builds its ``Trainer`` from it and trains; SIGTERM is forwarded to them; when
one dies the others are stopped and the error names the rank that failed first; and rank
0's result file (``marquardt.trainer._persistence._handback``) is read back for the
caller. A rank that ends with one of the trainer's own errors (``NonFiniteLossError``,
``RunFilesError``, ``ConfigError``, ...) leaves it pickled beside the result file, and the
caller gets that error itself (chained from the ``WorkerFailedError``), as it would without a
spawn. ``train_spawned`` is the whole round for the caller: spawn, wait, and load rank 0's
trained state into the caller's model, loop, scheduler and callbacks.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import tempfile
from typing import Any

import torch.multiprocessing as mp

from .._environments import ProcessLayout
from .._errors import ConfigError, TrainerError, WorkerFailedError
from .._logging._base import notice
from .._loops._base import Loop
from .._persistence._handback import apply_result, read_result
from .._result import OptimizeResult
from .._signals import SignalForwarder, exit_with_parent
from .._state import TrainerState
from ._spec import WorkerSpec
from ._worker import PEER_FAILED_EXIT, run_worker


def train_spawned(
    spec: WorkerSpec,
    layouts: list[ProcessLayout],
    loop: Loop,
    scheduler: Any,
    state: TrainerState,
) -> OptimizeResult | None:
    """Train in spawned processes; the caller's model, optimizer (through ``loop``),
    ``scheduler``, callbacks and ``state`` get rank 0's trained state.

    Arguments:
        spec: what every spawned process builds its ``Trainer`` from.
        layouts: one per process to spawn.
        loop: the caller's loop, which takes the trained optimizer state.
        scheduler: the caller's LR scheduler, or ``None``.
        state: the caller's ``TrainerState`` (step, stop reason, interruption).

    Returns:
        Rank 0's final ``opt_result`` around the caller's model and optimizer, or ``None``
        when the run ended before one was made.
    """
    result = fit_spawn(spec, layouts)
    apply_result(result, loop, scheduler, spec.config.callbacks, state)
    if state.interrupted:
        notice(
            f"{spec.launcher}: training stopped by SIGTERM at step {state.step}; the "
            "checkpoint is written, exiting with status 0 (resume with "
            "resume_from='latest')"
        )
    summary = result.get("opt_result")
    if summary is None:
        return None
    return OptimizeResult(
        summary["iteration"], loop.model, loop.optimizer, summary["loss"], summary["metrics"]
    )


def fit_spawn(spec: WorkerSpec, layouts: list[ProcessLayout]) -> dict[str, Any]:
    """Train in one new process per layout; return rank 0's result (the trained state)."""
    workdir = tempfile.mkdtemp(prefix="marquardt-spawn-")
    spec.result_path = os.path.join(workdir, "result.pt")
    try:
        # Plain pickle copies tensors (torch's own reducer would share the caller's
        # storage with every child, which would then all write to it).
        data = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise ConfigError(
            f"{spec.launcher}: the model, optimizer, loss, callbacks and data (loaders, "
            f"datasets or dataset factories) are sent to {len(layouts)} new processes, but one "
            f"of them cannot be pickled ({type(exc).__name__}: {exc}). HINT: define functions "
            "and classes at module level (no lambdas or local classes), keep the training code "
            "under if __name__ == '__main__':, and pass data that cannot be pickled as a "
            "module-level dataset factory (fit(train_dataset=make_dataset, batch_size=...))"
        ) from exc
    try:
        try:
            _join_spawned(data, layouts)
        except WorkerFailedError as failed:
            own = _kept_error(workdir, failed.rank)
            if own is not None:
                raise own from failed
            raise
        return read_result(spec.result_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _keep_error(workdir: str, rank: int, exc: TrainerError) -> None:
    """Pickle ``exc`` as ``error-<rank>.pkl`` in ``workdir`` (nothing when it cannot be)."""
    try:
        data = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
    except Exception:
        return
    path = os.path.join(workdir, f"error-{rank}.pkl")
    with open(path + ".tmp", "wb") as out:
        out.write(data)
    os.replace(path + ".tmp", path)


def _kept_error(workdir: str, culprit: int | None) -> TrainerError | None:
    """The error the rank ``culprit`` kept, else the lowest rank's, else None."""
    kept = sorted(
        int(name[6:-4])
        for name in os.listdir(workdir)
        if name.startswith("error-") and name.endswith(".pkl")
    )
    if not kept:
        return None
    rank = culprit if culprit in kept else kept[0]
    with open(os.path.join(workdir, f"error-{rank}.pkl"), "rb") as data:
        error = pickle.load(data)
    return error if isinstance(error, TrainerError) else None


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
    """A spawned training process: build the ``Trainer`` from the spec and train."""
    exit_with_parent()
    spec: WorkerSpec = pickle.loads(data)
    layout = layouts[index]
    trainer = spec.build(layout)
    context = trainer.run_context()
    context.threads = spec.threads
    # A lost peer ends this process inside run_worker with PEER_FAILED_EXIT, which tells
    # the parent this rank is not the culprit.
    try:
        run_worker(
            context,
            trainer.environment,
            layout,
            spec.plan,
            spec.data,
            spec.result_path if index == 0 else None,
        )
    except TrainerError as exc:
        if not isinstance(exc, WorkerFailedError):
            _keep_error(os.path.dirname(spec.result_path), layout.rank, exc)
        raise
