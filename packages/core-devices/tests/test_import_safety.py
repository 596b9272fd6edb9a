"""Importing and asking never initialises CUDA, never imports Legate, torch only on demand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

PROBE = """
import sys
import marquardt.devices as devices
assert "torch" not in sys.modules, "torch imported by marquardt.devices"
assert "pynvml" not in sys.modules, "pynvml imported at import time"
devices.discover_gpus()
devices.legate_gpu_count()
devices.plan(769, 100000)
assert not any(m.split(".")[0] == "legate" for m in sys.modules), "legate imported"
import torch
assert not torch.cuda.is_initialized(), "CUDA initialised by discovery"
devices.get_available_gpus()
assert not torch.cuda.is_initialized(), "CUDA initialised by get_available_gpus"
assert not any(m.split(".")[0] == "legate" for m in sys.modules), "legate imported"
print("clean")
"""


def test_no_cuda_no_legate_in_a_fresh_process() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    env.pop("LEGATE_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"
