"""Run several of this folder's scripts under one package, importing it once.

    TRAINER_MODULE=perceptrain python _run_all.py OUT seed_train.py callback_function.py ...

The package, torch and the readers the harness uses are imported here once; each script
then runs in a forked child (so class-level state such as ``Trainer.set_use_grad`` and the
default dtype never leak from one script into the next), with its stdout and stderr in
``OUT/<script>.out`` / ``.err`` and its exit status in ``OUT/<script>.rc``. A script that
runs longer than ``--timeout`` seconds is killed and gets status 124.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _preload() -> None:
    """Import what every script needs, so that children start warm."""
    sys.path.insert(0, str(HERE))
    import matplotlib

    matplotlib.use("Agg")
    import _harness
    import matplotlib.pyplot
    import torch  # noqa: F401

    for optional in ("nevergrad", "tensorboard.backend.event_processing.event_accumulator"):
        with contextlib.suppress(ImportError):
            importlib.import_module(optional)
    with contextlib.suppress(ImportError):
        _harness.api()  # a package that does not import is reported by each script


def _child(script: Path, out: Path) -> None:
    stdout = os.open(out / f"{script.stem}.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    stderr = os.open(out / f"{script.stem}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    sys.argv = [str(script)]
    status = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 124
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("scripts", nargs="+", type=Path)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    _preload()
    for script in args.scripts:
        script = script if script.is_absolute() else HERE / script
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(script, args.out)
        status = _wait(pid, args.timeout)
        (args.out / f"{script.stem}.rc").write_text(f"{status} {time.monotonic() - started:.2f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
