"""The driver stub lets the GPU wheels of Legate and cuPyNumeric run on CPUs.

Both ways of starting Legate are checked, each in its own process: ``python`` with
``LEGATE_CONFIG`` (what the other ``legate`` tests use) and the ``legate`` launcher (what
users and the integration tests use). The child computes JᵀJ + εI and its Cholesky factor
in cuPyNumeric and reports Legate's processors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from legate_support import build_stub, env_for_legate_cpu, legate_launcher, run_json

pytestmark = pytest.mark.legate

WORKER = Path(__file__).resolve().parents[1] / "legate_support" / "worker_smoke.py"
TIMEOUT = 240.0


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_stub(tmp_path_factory.mktemp("libcuda")).parent


def test_stub_is_a_shared_library_named_libcuda(stub_dir: Path) -> None:
    library = stub_dir / "libcuda.so.1"
    assert library.is_file()
    assert library.read_bytes()[:4] == b"\x7fELF"


def _check(result: dict[str, Any], cpus: int) -> None:
    assert result["gpus"] == 0
    assert result["cpus"] == cpus
    assert result["gram_error"] <= 1e-12 * result["scale"]
    assert result["factor_error"] <= 1e-12 * result["scale"]


def test_python_with_legate_config_runs_on_one_cpu(stub_dir: Path) -> None:
    env = env_for_legate_cpu(stub_dir, cpus=1)
    _check(run_json([sys.executable, str(WORKER)], env, timeout=TIMEOUT), cpus=1)


def test_legate_launcher_runs_on_two_cpus(stub_dir: Path) -> None:
    env = env_for_legate_cpu(stub_dir)
    command = [*legate_launcher(), "--cpus", "2", "--gpus", "0", "--sysmem", "2000", str(WORKER)]
    _check(run_json(command, env, timeout=TIMEOUT), cpus=2)
