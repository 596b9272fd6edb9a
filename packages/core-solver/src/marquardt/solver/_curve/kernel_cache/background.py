"""Kernels built without blocking the call: a background process traces and compiles
what the call ran eagerly, and a later call or process loads it.

Under ``compile="auto"`` a call whose kernel is not kept runs eagerly now and notes, for
each missing kernel, how to trace it (a ``Job``). When the call ends (so that the builder
does not compete with it) the calling process forks once (f cannot be sent to another
process: the child inherits it). The child, in a session of its own (the terminal's Ctrl-C
does not reach it), writing only to the builders' log and at low priority
(``os.nice(NICE)``), traces each kernel's graph of ATen operations (``make_fx``) and
exports it (``torch.export``) on one thread (the caller's OpenMP threads are not in a
forked child, and GNU OpenMP would wait for them forever in a parallel region), writes the
exported programs to a private file and becomes a fresh interpreter (``exec``: the same
process, with OpenMP threads of its own), which, for each kernel in turn:

- runs on the thread count the kernel is built for (``kernel_key.build_threads``);
- refuses a cache folder that is inside a git work tree or that another account could
  write to (``artifacts.writable_folder``, the trust check);
- holds the key's build lock (``build_lock``: ``flock``, dropped by the system when the
  builder dies), so that two processes never build one key, and leaves quietly where
  another builder holds it;
- compiles the package (``artifacts.keep``: written under a temporary name and renamed,
  the manifest last).

The builder ends after ``BUILD_SECONDS`` at most (``SIGALRM``), leaving no manifest and,
once the next builder of the key takes the lock, no temporary file. The call itself pays
only the fork (milliseconds), not the trace. ``python -m marquardt.solver.cache list``
shows the builds in progress. At the calling interpreter's exit a build continues (the
kernel is for later processes; its time limit bounds it, and its low priority keeps it out
of the way); ``cancel`` ends this process's builds at once, ``wait`` waits for them.
``MARQUARDT_SOLVER_BACKGROUND_BUILD=0`` turns background builds off (the call then runs
eagerly and nothing is built).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..._settings import cache_dir
from . import artifacts, build_lock

__all__ = [
    "BUILD_SECONDS",
    "LOG",
    "NICE",
    "Builder",
    "Job",
    "cancel",
    "done",
    "main",
    "start",
    "wait",
]

#: The most seconds a background build runs (waiting for the lock included).
BUILD_SECONDS = 600
#: How much a background build lowers its priority (``os.nice``).
NICE = 10
#: What the forked builder becomes to compile (``main``): a fresh interpreter, whose
#: OpenMP threads are its own.
_BOOT = (
    "import sys; from marquardt.solver._curve.kernel_cache.background import main; "
    "sys.exit(main(sys.argv[1]))"
)
#: The builders' log in the cache folder: a line per build (built, left to another
#: builder, failed and why), and whatever the compiler says.
LOG = "builds.log"
#: How often ``Builder.wait`` looks whether its builder has ended, in seconds.
POLL_SECONDS = 0.05


@dataclass
class Job:
    """One kernel to build: its ``key`` and ``description`` (``kernel_key``), ``trace()``
    giving its traced graph of ATen operations and example inputs (CPU tensors), and the
    ``threads`` it is built for."""

    key: str
    description: dict[str, Any]
    trace: Callable[[], tuple[torch.fx.GraphModule, list[torch.Tensor]]]
    threads: int


class Builder:
    """A forked background builder of this process: ``pid``, ``poll()`` (None while it
    runs, else its exit status) and ``wait(timeout)``, as ``subprocess.Popen`` has them."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit status, or None while it runs (reaped once it has ended)."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it has ended
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status once it has ended; ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"builder {self.pid} still running")
            time.sleep(POLL_SECONDS)
        assert self.returncode is not None
        return self.returncode


#: This process's builds, by key.
_STARTED: dict[str, Builder] = {}


def start(jobs: list[Job]) -> bool:
    """Fork one background builder that traces and builds ``jobs`` in turn.

    **Arguments:** ``jobs``: the kernels a call found missing (those this process started
    a build of already are left out).

    **Returns:** whether a builder was started (False where no job is left, the cache
    folder may not keep kernels, or the system cannot fork).
    """
    jobs = [job for job in jobs if job.key not in _STARTED]
    folder = artifacts.writable_folder()
    if not jobs or folder is None or not hasattr(os, "fork"):
        return False
    log = os.open(folder / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():  # forking a process with threads: the child uses none
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: it never returns into the caller's code
        status = 1
        try:
            status = _child(log, folder, jobs)
        except Exception as err:  # said in the log, not lost with the process
            _say(_failure("", err))
        finally:
            os._exit(status)
    os.close(log)
    builder = Builder(pid)
    for job in jobs:
        _STARTED[job.key] = builder
    return True


def done(key: str) -> bool:
    """Whether this process started a build of ``key`` that has ended since."""
    builder = _STARTED.get(key)
    return builder is not None and builder.poll() is not None


def wait(timeout: float = BUILD_SECONDS) -> bool:
    """Wait for this process's background builds to end.

    **Arguments:** ``timeout``: the most seconds to wait, for all of them.

    **Returns:** whether every one has ended.
    """
    deadline = time.monotonic() + timeout
    for builder in _builders():
        try:
            builder.wait(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return False
    return True


def cancel() -> int:
    """End this process's background builds now (SIGKILL to each builder's session: the
    compiler it runs too) and remove their half-made files; their locks died with them.

    **Returns:** how many were still running.
    """
    running = 0
    for builder in _builders():
        if builder.poll() is None:
            running += 1
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(builder.pid, signal.SIGKILL)
            builder.wait()
            for left in cache_dir().glob(f".tmp-*-{builder.pid}-*"):
                left.unlink(missing_ok=True)  # its half-made files (named by its pid)
    return running


def _builders() -> list[Builder]:
    """This process's builders, each once."""
    return list({id(b): b for b in _STARTED.values()}.values())


def _picklable(graph: torch.fx.GraphModule) -> None:
    """The traced graph made picklable, computing the same: constants that are torch's
    efficient zero tensors (forward-mode tangents) become ordinary zeros, and the type
    annotations the tracer copied from the Python function (strings under postponed
    annotations) are dropped; in the graph and in its branches' graphs (``torch.cond``)."""
    parts = [m for m in graph.modules() if isinstance(m, torch.fx.GraphModule)]
    for part in parts:
        for node in part.graph.nodes:
            node.type = None
            if node.op != "get_attr":
                continue
            value = getattr(part, str(node.target))
            if isinstance(value, torch.Tensor) and value._is_zerotensor():
                plain = torch.zeros(value.shape, dtype=value.dtype, device=value.device)
                setattr(part, str(node.target), plain)
        part.recompile()


def _child(log: int, folder: Path, jobs: list[Job]) -> int:
    """The forked builder's body (module docstring): it traces the jobs, writes them to a
    private file and becomes a fresh interpreter (``exec``, the same process) that compiles
    them (``main``); it returns only where that fails.

    **Arguments:** ``log``: a descriptor of the builders' log; ``folder``: the cache
    folder; ``jobs``: what to build, in turn.

    **Returns:** the exit status where no compile could start: 1.
    """
    os.setsid()  # its own session: the terminal's Ctrl-C does not reach it
    quiet = os.open(os.devnull, os.O_RDONLY)
    os.dup2(quiet, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    for number in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, OSError):  # the caller's handlers are not ours
            signal.signal(number, signal.SIG_DFL)
    signal.alarm(BUILD_SECONDS)  # bounded (kept across exec): the default action ends it
    with contextlib.suppress(OSError):  # a system that refuses it: normal priority
        os.nice(NICE)
    # The caller's OpenMP threads are not in this process, and GNU OpenMP waits for them
    # forever in its next parallel region: the trace runs on one thread, and the compile
    # (which runs operations of its own, on the kernel's threads) in a fresh interpreter.
    torch.set_num_threads(1)
    work = []
    for job in jobs:
        try:
            graph, inputs = job.trace()
            _picklable(graph)
            # Exported here, written as torch.export writes it: a traced graph with a
            # ``torch.cond`` cannot be pickled back (unpickling traces it again).
            program = io.BytesIO()
            torch.export.save(artifacts.exported(graph, inputs), program)
        except Exception as err:  # the model cannot be traced: the next call runs eagerly
            _say(_failure(_named(job.key, job.description), err))
            continue
        work.append({**vars(job), "trace": None, "program": program.getvalue()})
    if not work:
        return 1
    path = folder / f".tmp-jobs-{os.getpid()}-{time.time_ns()}.pkl"  # cancel's pattern
    try:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            pickle.dump(work, out)
        os.execv(sys.executable, [sys.executable, "-c", _BOOT, str(path)])
    finally:  # reached only where the file or the exec failed
        path.unlink(missing_ok=True)
    return 1  # pragma: no cover - execv does not return


def main(path: str) -> int:
    """The compiling builder's body (module docstring), in the interpreter ``_child``
    became.

    **Arguments:** ``path``: the private file of traced jobs (removed once read).

    **Returns:** the exit status: 0 every kernel built or left to another builder, 1 some
    failed, 2 no folder to keep them in.
    """
    # Imported before the programs are read back: they name the compiler's operations.
    import torch._inductor  # noqa: F401

    with open(path, "rb") as jobs_file:
        jobs = pickle.load(jobs_file)
    Path(path).unlink(missing_ok=True)
    folder = artifacts.writable_folder()
    if folder is None:
        _say(f"not built {len(jobs)} kernels: no cache folder to keep them in")
        return 2
    return 1 if sum(_build(folder, work) for work in jobs) else 0


def _build(folder: Path, work: dict[str, Any]) -> int:
    """Build one traced job in the builder (``main``); 0 built or left to another builder,
    1 failed (said in the log)."""
    torch.set_num_threads(int(work["threads"]))
    key, about = work["key"], work["description"]
    what = _named(key, about)

    def build(path: Path) -> None:  # under the key's lock: one compile at a time
        with build_lock.held(folder, build_lock.QUEUE, {}, BUILD_SECONDS) as turn:
            if not turn:
                raise TimeoutError("no turn to compile within the time limit")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.export.load(io.BytesIO(work["program"]))
                artifacts.compile_exported(program, path)

    started = time.perf_counter()
    try:
        kept = artifacts.keep(folder, key, about, build, BUILD_SECONDS)
    except Exception as err:  # a failed build leaves nothing: the next call runs eagerly
        _say(_failure(what, err))
        return 1
    seconds = time.perf_counter() - started
    _say(f"{'built' if kept else 'left to another builder'} {what} in {seconds:.1f} s")
    return 0


def _named(key: str, about: dict[str, Any]) -> str:
    """A kernel as the log names it: its model, its kind and the first 12 characters of its
    key."""
    return f"{about.get('name')} {about.get('kind')} {key[:12]}"


def _failure(what: str, err: Exception) -> str:
    """The log line of a failed trace or build of ``what`` (a whole builder: ""): the
    error's type and the first line of its message (at most 300 characters; the type
    alone for an error without one)."""
    first = str(err).splitlines()[:1]
    said = f"{type(err).__name__}: {first[0][:300]}" if first else type(err).__name__
    return f"failed {what}: {said}" if what else f"failed: {said}"


def _say(text: str) -> None:
    """One line in the builders' log (``LOG``: this process's stderr)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"{stamp} marquardt build (pid {os.getpid()}): {text}\n")
    sys.stderr.flush()
