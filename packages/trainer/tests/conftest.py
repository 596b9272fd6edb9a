"""Shared helpers: subprocess runs with a timeout and guaranteed clean-up, a clean launch env."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from marquardt.testing.processes import free_port

SCRIPTS = Path(__file__).parent / "scripts"
LAUNCH_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LEGATE_", "MARQUARDT_TRAINER_")
LAUNCH_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without any launcher's variables, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(LAUNCH_PREFIXES) and k not in LAUNCH_NAMES
    }
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process tests must not see a launcher that started pytest itself."""
    for key in list(os.environ):
        if key.startswith(LAUNCH_PREFIXES) or key in LAUNCH_NAMES:
            monkeypatch.delenv(key, raising=False)


class Processes:
    """Start subprocesses in their own session; kill every one of them at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(
        self, args: list[str], cwd: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=cwd,
            env=env or clean_env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.started.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            out, err = proc.communicate()
            pytest.fail(f"timed out after {timeout} s: {proc.args}\n{out}\n{err}")
        return proc.returncode, out, err

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
    ) -> tuple[int, str, str]:
        return self.wait(self.start(args, cwd, env), timeout)

    @staticmethod
    def kill(proc: subprocess.Popen[str]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def cleanup(self) -> None:
        for proc in self.started:
            # The whole session, even when its leader is gone: children may be left over.
            self.kill(proc)
            if proc.returncode is None:
                proc.communicate()


@pytest.fixture
def procs() -> Iterator[Processes]:
    p = Processes()
    try:
        yield p
    finally:
        p.cleanup()


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def start_srun_tasks(
    procs: Processes, args: list[str], cwd: Path, **slurm: str
) -> list[subprocess.Popen[str]]:
    """Two tasks of one srun step on this host (one task per process), ranks 0 and 1."""
    port = str(free_port())
    started = []
    for rank in (0, 1):
        env = clean_env(
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS="2",
            SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=port,
            **slurm,
        )
        started.append(procs.start(args, cwd=cwd, env=env))
    return started


@pytest.fixture
def restore_use_grad() -> Iterator[None]:
    """``Trainer.set_use_grad(True)`` again after the test, whatever the test set."""
    yield
    from marquardt.trainer import Trainer

    Trainer.set_use_grad(True)
