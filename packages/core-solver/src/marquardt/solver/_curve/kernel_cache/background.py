"""Kernels built without blocking the call: a background process compiles what the call
traced, and a later call or process loads it.

Under ``compile="auto"`` a call whose kernel is not kept runs eagerly now. The graph is
traced in the calling process (``make_fx``: f cannot be sent to another process, the
traced graph of ATen operations can), pickled with its example inputs and, when the call
ends (so that the builder does not compete with it), sent with the call's other missing
kernels through a pipe to one new Python process (``python -c``, started in its own
session so that the terminal's Ctrl-C does not reach it), which, for each kernel in turn:

- lowers its priority (``os.nice(NICE)``) and runs on the thread count the kernel is built
  for (``kernel_key.build_threads``);
- refuses a cache folder that is inside a git work tree or that another account could
  write to (``artifacts.writable_folder``, the trust check);
- holds the key's build lock (``build_lock``: ``flock``, dropped by the system when the
  builder dies), so that two processes never build one key, and leaves quietly where
  another builder holds it;
- compiles the package (``artifacts.keep``: written under a temporary name and renamed,
  the manifest last), and ends after ``BUILD_SECONDS`` at most (``SIGALRM``), leaving no
  manifest and, once the next builder of the key takes the lock, no temporary file.

``python -m marquardt.solver.cache list`` shows the builds in progress. At the calling
interpreter's exit a build continues (the kernel is for later processes; its time limit
bounds it, and its low priority keeps it out of the way); ``cancel`` ends this process's
builds at once, ``wait`` waits for them. ``MARQUARDT_SOLVER_BACKGROUND_BUILD=0`` turns
background builds off (the call then runs eagerly and nothing is built).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..._settings import cache_dir
from . import artifacts, build_lock

__all__ = ["BUILD_SECONDS", "LOG", "NICE", "Job", "cancel", "done", "main", "start", "wait"]

#: The most seconds a background build runs (waiting for the lock included).
BUILD_SECONDS = 600
#: How much a background build lowers its priority (``os.nice``).
NICE = 10
#: What the new process runs: its job is read from the pipe before anything is imported,
#: so that the caller's write never waits on the builder's imports.
_BOOT = (
    "import sys; job = sys.stdin.buffer.read(); "
    "from marquardt.solver._curve.kernel_cache.background import main; sys.exit(main(job))"
)
#: The builders' log in the cache folder: a line per build (built, left to another
#: builder, failed and why), and whatever the compiler says.
LOG = "builds.log"
#: This process's builds, by key.
_STARTED: dict[str, subprocess.Popen[bytes]] = {}


def _picklable(graph: torch.fx.GraphModule) -> None:
    """The traced graph made picklable, computing the same: constants that are torch's
    efficient zero tensors (forward-mode tangents) become ordinary zeros, and the type
    annotations the tracer copied from the Python function (strings under postponed
    annotations) are dropped."""
    for node in graph.graph.nodes:
        node.type = None
        if node.op != "get_attr":
            continue
        value = getattr(graph, str(node.target))
        if isinstance(value, torch.Tensor) and value._is_zerotensor():
            plain = torch.zeros(value.shape, dtype=value.dtype, device=value.device)
            setattr(graph, str(node.target), plain)
    graph.recompile()


@dataclass
class Job:
    """One kernel to build: its ``key`` and ``description`` (``kernel_key``), its traced
    ``graph`` with example ``inputs`` (CPU tensors), and the ``threads`` it is built for."""

    key: str
    description: dict[str, Any]
    graph: torch.fx.GraphModule
    inputs: list[torch.Tensor]
    threads: int


def start(jobs: list[Job]) -> bool:
    """Start one background process that builds ``jobs`` in turn.

    **Arguments:** ``jobs``: the kernels a call found missing (those this process started
    a build of already are left out).

    **Returns:** whether a process was started (False where no job is left, or the cache
    folder may not keep kernels).
    """
    jobs = [job for job in jobs if job.key not in _STARTED]
    folder = artifacts.writable_folder()
    if not jobs or folder is None:
        return False
    for job in jobs:
        _picklable(job.graph)
    blob = pickle.dumps([vars(job) for job in jobs])
    log = os.open(folder / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOT],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    finally:
        os.close(log)
    for job in jobs:
        _STARTED[job.key] = process

    def send() -> None:
        try:
            assert process.stdin is not None
            process.stdin.write(blob)
            process.stdin.close()
        except OSError:  # the builder ended first (killed): it built nothing
            pass

    threading.Thread(target=send, name="marquardt-build", daemon=True).start()
    return True


def done(key: str) -> bool:
    """Whether this process started a build of ``key`` that has ended since."""
    process = _STARTED.get(key)
    return process is not None and process.poll() is not None


def wait(timeout: float = BUILD_SECONDS) -> bool:
    """Wait for this process's background builds to end.

    **Arguments:** ``timeout``: the most seconds to wait, for all of them.

    **Returns:** whether every one has ended.
    """
    deadline = time.monotonic() + timeout
    for process in _processes():
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


def cancel() -> int:
    """End this process's background builds now (SIGKILL to each builder's session: the
    compiler it runs too) and remove their half-made files; their locks died with them.

    **Returns:** how many were still running.
    """
    running = 0
    for process in _processes():
        if process.poll() is None:
            running += 1
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for left in cache_dir().glob(f".tmp-*-{process.pid}-*"):
                left.unlink(missing_ok=True)  # its half-made files (named by its pid)
    return running


def _processes() -> list[subprocess.Popen[bytes]]:
    """This process's builders, each once."""
    return list({id(p): p for p in _STARTED.values()}.values())


def main(job: bytes) -> int:
    """The background builder's body (module docstring).

    **Arguments:** ``job``: the pickled jobs (``Job``'s fields, one dict each).

    **Returns:** the exit status: 0 every kernel built or left to another builder, 1 some
    failed, 2 no folder to keep them in.
    """
    signal.alarm(BUILD_SECONDS)  # bounded: the default action ends the process
    with contextlib.suppress(OSError):  # a system that refuses it: normal priority
        os.nice(NICE)
    # Imported before the graphs are rebuilt: their tracer looks for the compiler's ops.
    import torch._inductor  # noqa: F401

    jobs = pickle.loads(job)
    folder = artifacts.writable_folder()
    if folder is None:
        _say(f"not built {len(jobs)} kernels: no cache folder to keep them in")
        return 2
    failed = 0
    for work in jobs:
        failed += _build(folder, work)
    return 1 if failed else 0


def _build(folder: Path, work: dict[str, Any]) -> int:
    """Build one job in the builder (``main``); 0 built or left to another builder, 1
    failed (said in the log)."""
    torch.set_num_threads(int(work["threads"]))
    key, about = work["key"], work["description"]
    what = f"{about.get('name')} {about.get('kind')} {key[:12]}"

    def build(path: Path) -> None:  # under the key's lock: one compile at a time
        with build_lock.held(folder, build_lock.QUEUE, {}, BUILD_SECONDS) as turn:
            if not turn:
                raise TimeoutError("no turn to compile within the time limit")
            artifacts.compile_package(work["graph"], work["inputs"], path)

    started = time.perf_counter()
    try:
        kept = artifacts.keep(folder, key, about, build, BUILD_SECONDS)
    except Exception as err:  # a failed build leaves nothing: the next call runs eagerly
        _say(f"failed {what}: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
        return 1
    seconds = time.perf_counter() - started
    _say(f"{'built' if kept else 'left to another builder'} {what} in {seconds:.1f} s")
    return 0


def _say(text: str) -> None:
    """One line in the builders' log (``LOG``: this process's stderr)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"{stamp} marquardt build (pid {os.getpid()}): {text}\n")
    sys.stderr.flush()
