"""Running Legate and cuPyNumeric on CPUs, in child processes, for the ``legate`` tests.

The PyPI wheels of Legate and cuPyNumeric are GPU builds linked against the NVIDIA driver
library ``libcuda.so.1``. On a machine without a driver, :func:`build_stub` compiles
``libcuda_stub.c`` (next to this file) into a stand-in ``libcuda.so.1`` whose every call
answers "no device"; with it first on ``LD_LIBRARY_PATH`` and Legate configured for CPUs
only (:func:`env_for_legate_cpu`), ``import cupynumeric`` works and all its work runs on
Legate's CPU processors.

Legate starts once per process and changes process state when imported (it seeds NumPy's
and Python's random generators, sets ``NCCL_LAUNCH_MODE``), and cuPyNumeric hangs in a
forked child, so every Legate test runs its Legate work in a fresh process
(:func:`run_json`) and asserts in the parent on the JSON the child prints last.

The integration tests reuse ``libcuda_stub.c`` by path (:data:`STUB_SOURCE`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "JSON_MARKER",
    "STUB_SOURCE",
    "build_stub",
    "env_for_legate",
    "env_for_legate_cpu",
    "legate_launcher",
    "run_json",
    "run_process",
]

#: The C source of the driver stub; self-contained, built by :func:`build_stub`.
STUB_SOURCE = Path(__file__).with_name("libcuda_stub.c")

#: A child prints one line ``JSON_MARKER + json.dumps(result)``; :func:`run_json` parses it.
JSON_MARKER = "@@LEGATE-RESULT@@ "

#: ``CUPYNUMERIC_MATMUL_CACHE_SIZE`` for the children: ``A.T @ A`` with a tall A splits its
#: rows across processors only when (m+n)·k·itemsize < this × processors (default 128 MiB).
MATMUL_CACHE_SIZE = str(1 << 34)


def build_stub(dest_dir: str | os.PathLike[str]) -> Path:
    """Compile ``libcuda_stub.c`` into ``dest_dir/libcuda.so.1`` with gcc; return its path.

    Raises ``RuntimeError`` (with the compiler's output) when gcc is missing or fails.
    """
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError(
            "building the libcuda.so.1 stub for Legate-on-CPU tests needs a C compiler; "
            "neither gcc nor cc is on PATH. HINT: apt-get install gcc"
        )
    target = dest / "libcuda.so.1"
    command = [
        compiler, "-shared", "-fPIC", "-O2", "-Wall",
        "-Wl,-soname,libcuda.so.1", "-o", str(target), str(STUB_SOURCE),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"compiling {STUB_SOURCE} failed (exit {done.returncode}):\n{done.stderr}"
            "HINT: the stub needs only a C99 compiler and the C library headers"
        )
    return target


def env_for_legate(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child that runs Legate (on GPUs or, with
    :func:`env_for_legate_cpu`, on CPUs), from ``base`` (default: this process's).

    ``LEGATE_AUTO_CONFIG=0`` stops Legate from sizing itself to the machine (the child's
    flags or ``LEGATE_CONFIG`` decide); a backend override left in the caller's environment
    is dropped, so that results do not depend on it; this interpreter's folder goes first
    on ``PATH``, since the ``legate`` launcher starts ``python`` from ``PATH`` and must start
    this one, not the first one found.
    """
    env = dict(os.environ if base is None else base)
    env["LEGATE_AUTO_CONFIG"] = "0"
    env.pop("MARQUARDT_SOLVER_BACKEND", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PATH"] = os.pathsep.join(
        p for p in (str(Path(sys.executable).parent), env.get("PATH")) if p
    )
    return env


def env_for_legate_cpu(
    stub_dir: str | os.PathLike[str],
    *,
    cpus: int = 1,
    sysmem_mb: int = 2000,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for a child that runs Legate on ``cpus`` CPU processors, no GPU:
    :func:`env_for_legate`'s, and the driver stub.

    ``stub_dir`` holds the ``libcuda.so.1`` of :func:`build_stub`; it goes first on
    ``LD_LIBRARY_PATH`` so that it shadows any real driver. ``LEGATE_CONFIG`` asks for CPUs
    only (the ``legate`` launcher replaces it with its own flags). OpenMP and BLAS threads
    are held to one so that Legate's CPU processors and torch's threads share the cores
    politely.
    """
    env = env_for_legate(base)
    previous = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(stub_dir), previous) if p)
    env["LEGATE_CONFIG"] = f"--cpus {cpus} --gpus 0 --sysmem {sysmem_mb}"
    env.setdefault("CUPYNUMERIC_MATMUL_CACHE_SIZE", MATMUL_CACHE_SIZE)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


def legate_launcher() -> list[str]:
    """The ``legate`` launcher of this interpreter's environment, as a command prefix.

    Prefers the script next to ``sys.executable`` (a nox or virtual environment), then
    ``legate`` on ``PATH``.
    """
    beside = Path(sys.executable).with_name("legate")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("legate")
    if found is None:
        raise RuntimeError(
            f"the legate launcher is neither next to {sys.executable} nor on PATH. "
            "HINT: pip install legate nvidia-cupynumeric (the core-solver 'legate' extra)"
        )
    return [found]


def run_process(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in its own process group and return its exit code and output.

    The child is killed (with its whole group) when it outlives ``timeout`` seconds, which
    raises ``AssertionError`` carrying the tail of its output; so does a non-zero exit.
    """
    process = subprocess.Popen(
        list(command),
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)} did not finish within {timeout} s and was killed.\n"
            f"stdout tail:\n{stdout[-3000:]}\nstderr tail:\n{stderr[-3000:]}"
        ) from None
    finally:
        if process.poll() is None:  # an exception other than the timeout: leave nothing behind
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if process.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited with {process.returncode}.\n"
            f"stdout tail:\n{stdout[-3000:]}\nstderr tail:\n{stderr[-3000:]}"
        )
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)


def run_json(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
) -> Any:
    """:func:`run_process`, then the JSON of the child's last :data:`JSON_MARKER` line."""
    done = run_process(command, env, timeout=timeout, cwd=cwd)
    lines = [line for line in done.stdout.splitlines() if line.startswith(JSON_MARKER)]
    if not lines:
        raise AssertionError(
            f"{' '.join(command)} printed no result line.\n"
            f"stdout tail:\n{done.stdout[-3000:]}\nstderr tail:\n{done.stderr[-3000:]}"
        )
    return json.loads(lines[-1][len(JSON_MARKER) :])


def emit(result: Any) -> None:
    """Print ``result`` as the child's result line (used by the worker scripts)."""
    sys.stdout.write(JSON_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
