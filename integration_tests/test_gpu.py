"""The recipes on real GPUs: nccl DDP under torchrun, and the LM tutorial under legate.

Run by ``nox -s gpu_tests`` on a node with at least two NVIDIA GPUs; elsewhere they are
skipped, saying how many GPUs NVML found (none are touched through CUDA to find out).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _support import (
    FIT,
    LAUNCH,
    LM_EXAMPLE,
    assert_lm_fit,
    assert_ranks,
    assert_trained,
    base_env,
    describe_lines,
    run,
)


def _gpu_count() -> int:
    try:
        from marquardt.devices import discover_gpus

        return len(discover_gpus())
    except Exception:  # no NVML, no driver: no GPU to test on
        return 0


GPUS = _gpu_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS < 1, reason="needs an NVIDIA GPU; NVML finds none here"),
]
needs_two = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 NVIDIA GPUs; NVML finds {GPUS} here")


@pytest.mark.multiprocess
@pytest.mark.parametrize("nprocs", [1, pytest.param(2, marks=needs_two)])
def test_torchrun_nccl_on_the_gpus(tmp_path: Path, nprocs: int) -> None:
    """The torchrun recipe over nccl, one process per GPU: the DDP loop on cuda."""
    env = base_env(
        {"COMPUTE_SETUP": "gpu", "BACKEND": "nccl", "NPROCS": str(nprocs), "SCRIPT": str(FIT)}
    )
    done = run(["bash", str(LAUNCH / "torchrun" / "single_node.sh")], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.describe()
    assert_trained(done.output, world_size=nprocs, epochs=60, print_every=10)
    head = describe_lines(done.output)[0]
    assert head["loop"] == "DDP loop (nccl)" and head["device"].startswith("cuda"), head
    assert_ranks(done.output, nprocs)


@needs_two
@pytest.mark.legate
def test_legate_single_node_splits_the_gpus(tmp_path: Path) -> None:
    """K from marquardt-devices; the solver on cuPyNumeric, the model on the GPUs left."""
    env = base_env({"SCRIPT": str(LM_EXAMPLE)})
    env.pop("LEGATE_GPUS", None)
    done = run(
        ["bash", str(LAUNCH / "legate" / "single_node.sh"), "--epochs", "1"], env=env,
        cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.describe()
    assert "--gpus 0" not in done.stdout, done.stdout
    assert_lm_fit(done.stdout, steps=10)
    assert " on cuda:" in done.stdout, done.stdout
