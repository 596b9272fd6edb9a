"""A real 2-process gloo spawn through the Trainer: each rank trains with the thread count
of marquardt.devices' rule, unless the run's setting or the user's own count says otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marquardt.devices import threads_per_process

from ..conftest import SCRIPTS, Processes, clean_env

pytestmark = pytest.mark.multiprocess

SCRIPT = str(SCRIPTS / "threads.py")


def _spawn(procs: Processes, out: Path, *args: str) -> tuple[list[int], str]:
    env = clean_env()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(name, None)
    code, stdout, stderr = procs.run([SCRIPT, str(out), *args], out, env)
    assert code == 0, f"{stdout}\n{stderr}"
    counts = [json.loads((out / f"threads_{rank}.json").read_text())["threads"] for rank in (0, 1)]
    return counts, stdout


def test_spawned_workers_share_the_cores(procs: Processes, tmp_path: Path) -> None:
    rule = threads_per_process(2, processes_from="spawn", env={})
    assert rule.cores is not None and rule.threads == max(1, rule.cores.cores // 2)
    counts, stdout = _spawn(procs, tmp_path)
    assert counts == [rule.threads] * 2
    assert f"threads: {rule.describe()}" in stdout
    assert stdout.count("threads: ") == 1  # logged once per run


def test_the_runs_setting_wins_over_the_users_count(procs: Processes, tmp_path: Path) -> None:
    # the parent's own count (1) would win over the rule; the run's setting wins over both
    counts, stdout = _spawn(procs, tmp_path, "--threads-per-process", "2", "--user-threads", "1")
    assert counts == [2, 2] and "2 threads per process (setting)" in stdout
