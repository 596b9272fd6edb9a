"""The PBS (NCI Gadi) recipe: no PBS server here, so its directives are parsed and its
body is run by hand with the PBS_* variables a PBS job would have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _support import LAUNCH, LM_EXAMPLE, assert_lm_fit, base_env, legate_cpu_env, run

RECIPE = LAUNCH / "pbs" / "gadi_v100.pbs"
_WALLTIME = re.compile(r"^\d{1,3}:\d{2}:\d{2}$")
_MEM = re.compile(r"^\d+(?:[kKmMgGtT][bB])$")


def directives(text: str) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The ``#PBS`` options before the first command: (option, value) pairs and -l resources.

    PBS stops reading directives at the first line that is neither blank nor a comment.
    """
    options: list[tuple[str, str]] = []
    resources: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if not stripped.startswith("#PBS"):
            continue
        parts = stripped[len("#PBS") :].split(None, 1)
        flag, value = parts[0], (parts[1] if len(parts) > 1 else "")
        options.append((flag, value))
        if flag == "-l":
            for item in value.split(","):
                key, _, val = item.partition("=")
                resources[key] = val
    return options, resources


def test_directives_are_a_valid_gadi_gpu_request() -> None:
    options, res = directives(RECIPE.read_text())
    flags = dict(options)
    assert flags["-q"] == "gpuvolta"
    ngpus, ncpus = int(res["ngpus"]), int(res["ncpus"])
    # Gadi's gpuvolta: 12 cores per V100, whole GPUs; at most 4 GPUs (48 cores) per node.
    assert ncpus == 12 * ngpus and ngpus >= 1, res
    assert ngpus <= 4 or ngpus % 4 == 0, res
    assert _MEM.match(res["mem"]) and int(res["mem"][:-2]) <= 95 * ngpus, res
    assert _WALLTIME.match(res["walltime"]), res
    assert "wd" in res and "storage" in res, res
    assert flags.get("-j") == "oe" and flags.get("-N"), flags
    # Every directive must sit above the first command, or PBS ignores it silently.
    body = RECIPE.read_text().split("set -euo pipefail", 1)[1]
    assert "#PBS" not in body


@pytest.mark.legate
def test_body_runs_with_pbs_variables(legate_stub: Path, tmp_path: Path) -> None:
    """The script as PBS would start it on a node with one GPU: Legate gets none (CPUs)."""
    env = base_env({
        **legate_cpu_env(legate_stub),
        "PBS_JOBID": "12345.gadi-pbs", "PBS_O_WORKDIR": str(tmp_path), "PBS_NGPUS": "1",
        "PBS_NCPUS": "12", "PBS_JOBNAME": "sinc_lm", "PBS_ENVIRONMENT": "PBS_BATCH",
        "SCRIPT": str(LM_EXAMPLE), "SCRIPT_ARGS": "--epochs 1", "SYSMEM": "2000",
        "LEGATE_CPUS": "1",
        "VENV": str(tmp_path / "no-venv"), "HOME": str(tmp_path),
    })  # fmt: skip
    done = run(["bash", str(RECIPE)], env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.describe()
    assert "gadi_v100: job 12345.gadi-pbs" in done.stdout
    assert "1 GPU(s); legate --sysmem 2000 --gpus 0 --cpus 1" in done.stdout, done.stdout
    assert_lm_fit(done.stdout, steps=10)  # one epoch of 10 batches
