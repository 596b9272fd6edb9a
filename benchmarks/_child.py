"""Run one function of a benchmark module in a fresh process and read back what it returns.

Benchmarks measure in fresh processes where a process's state would bias the figure (its
peak RSS, threads, cached kernels, Legate's runtime, a rank of torch.distributed). This is
the one way they do it: ``call("bench_memory", "child", ["ours", 1000], timeout=600)``
runs ``python _child.py bench_memory child '["ours", 1000]'``, which imports the module,
calls the function with those arguments and prints its JSON-able result on a line of its
own after ``MARKER``; everything else the child prints is its log. ``run_all.py`` runs
each benchmark whole through the same call, streaming its log.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MARKER = "@@RESULT@@ "


def start(
    module: str,
    function: str,
    args: Sequence[Any] = (),
    *,
    env: dict[str, str] | None = None,
    launcher: Sequence[str] | None = None,
) -> subprocess.Popen[str]:
    """Start ``module.function(*args)`` in a fresh process (see ``finish``).

    **Arguments:**

    - `module`, `function`: a module of ``benchmarks/`` and a function of it.
    - `args`: its arguments (JSON-able).
    - `env`: the child's environment (None: this process's).
    - `launcher`: what runs the script instead of this Python (``["legate", "--cpus", "2"]``).

    **Returns:** the process, its output (stdout and stderr together) on a pipe.
    """
    command = [*(launcher or [sys.executable]), __file__, module, function, json.dumps(list(args))]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )


def finish(
    proc: subprocess.Popen[str], timeout: float, log: Callable[[str], None] | None = None
) -> tuple[Any, str]:
    """Wait for a child of ``start`` and read its result.

    **Arguments:**

    - `proc`: the child.
    - `timeout`: seconds to wait before it is killed.
    - `log`: called with each line of its log as it comes (None: the log is kept for the
      error only).

    **Returns:** ``(result, error)``: ``result`` is None when the child failed, timed out or
    returned nothing, with ``error`` saying how (the last lines of its log).
    """
    assert proc.stdout is not None
    result: Any = None
    returned = False
    tail: list[str] = []
    try:
        for line in proc.stdout:
            if line.startswith(MARKER):
                result, returned = json.loads(line[len(MARKER) :]), True
                continue
            if log is not None:
                log(line.rstrip())
            tail = [*tail, line.rstrip()][-3:]
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, f"timed out after {timeout:.0f} s"
    except BaseException:  # stopped (SIGTERM from a time limit, Ctrl-C): so is the child
        proc.kill()
        raise
    if code != 0 or not returned:
        return None, f"exit code {code}: " + " | ".join(tail)
    return result, ""


def call(
    module: str,
    function: str,
    args: Sequence[Any] = (),
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    launcher: Sequence[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[Any, str]:
    """``module.function(*args)`` in a fresh process: ``start`` then ``finish``.

    **Returns:** ``(result, error)`` as ``finish``'s.
    """
    return finish(start(module, function, args, env=env, launcher=launcher), timeout, log)


def jsonable(value: object) -> object:
    """``json.dumps``'s ``default``: NaN as null; dataclasses as dicts; dtypes, devices and
    paths as text."""
    import dataclasses

    import torch

    if isinstance(value, float) and value != value:
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    raise TypeError(f"not serialisable: {type(value).__name__}")


def main(argv: list[str]) -> int:
    """Inside the child: call the function and print its result after ``MARKER``."""
    module, function, args = argv
    sys.path.insert(0, str(HERE))
    result = getattr(importlib.import_module(module), function)(*json.loads(args))
    sys.stdout.flush()
    sys.stdout.write(MARKER + json.dumps(result, default=jsonable) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
