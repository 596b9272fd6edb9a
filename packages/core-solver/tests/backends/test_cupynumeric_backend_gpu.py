"""The cuPyNumeric backend with Legate on a real GPU (``nox -s gpu_tests`` on a GPU node).

A child started by ``legate --gpus 1`` (real driver, no stub) assembles J from CUDA slices
— staged through pinned host memory, since Legate can only attach GPUs it owns — solves
in Legate on its GPU, and runs a few problems of the shared suite through
``LMA(backend="auto")`` with the model on the GPUs Legate left (or the CPU when there is
only one GPU). Everything is compared with the NumPy backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from legate_support import env_for_legate, legate_launcher, run_json

from marquardt.devices import discover_gpus

WORKER = Path(__file__).resolve().parents[1] / "legate_support" / "worker_gpu.py"
TIMEOUT = 900.0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.legate,
    pytest.mark.skipif(
        not discover_gpus(), reason="no NVIDIA GPU found through NVML on this machine"
    ),
]


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    env = env_for_legate()
    # Leave GPU memory for torch when the model shares Legate's only GPU.
    command = [
        *legate_launcher(), "--gpus", "1", "--cpus", "1", "--fbmem", "4000",
        "--sysmem", "4000", str(WORKER),
    ]  # fmt: skip
    result: dict[str, Any] = run_json(command, env, timeout=TIMEOUT)
    return result


def test_legate_holds_one_gpu_and_devices_agree(report: dict[str, Any]) -> None:
    assert report["legate_gpus"] == 1
    assert report["legate_gpu_count"] == 1


def test_cuda_slices_are_staged_and_match_numpy(report: dict[str, Any]) -> None:
    staged = report["staged"]
    assert staged["slice_device"].startswith("cuda")
    assert staged["torch.float64"] <= 1e-10
    assert staged["torch.float32"] <= 1e-5  # float32 products, summed in another order
    assert staged["products"] <= 1e-12


@pytest.mark.parametrize("name", ["linear", "rosenbrock", "exponential", "misra1a"])
def test_auto_picks_cupynumeric_and_matches_numpy(report: dict[str, Any], name: str) -> None:
    run = report["lma"][name]
    assert run["backend"] == "cupynumeric"
    assert run["difference"] <= 1e-8
