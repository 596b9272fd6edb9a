"""``examples/sinc_lm.py`` (the tutorial as a script) runs under the ``legate`` launcher.

``legate --cpus 2 --gpus 0`` runs the script with one epoch (10 LM steps on batches of
10000, slices of 5000) and ``MARQUARDT_SOLVER_BACKEND=cupynumeric``, since ``auto`` keeps
the solve on the model's device when Legate holds no GPU. The test asserts that the script
exits cleanly, that the solve ran on the cuPyNumeric backend, and that the loss fell.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from legate_support import build_stub, env_for_legate_cpu, legate_launcher, run_process

pytestmark = pytest.mark.legate

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "sinc_lm.py"
TIMEOUT = 600.0
STEP = re.compile(r"step\s+(\d+)\s+loss\s+(\S+)")
EPOCH_MSE = re.compile(r"epoch\s+\d+ full-dataset MSE\s+(\S+)")


def test_sinc_example_fits_under_the_legate_launcher(tmp_path: Path) -> None:
    assert EXAMPLE.is_file(), f"{EXAMPLE} is missing"
    env = env_for_legate_cpu(build_stub(tmp_path / "libcuda").parent)
    env["MARQUARDT_SOLVER_BACKEND"] = "cupynumeric"
    command = [
        *legate_launcher(), "--cpus", "2", "--gpus", "0", "--sysmem", "2000",
        str(EXAMPLE), "--epochs", "1", "--out", str(tmp_path / "loss.png"),
    ]  # fmt: skip
    done = run_process(command, env, timeout=TIMEOUT, cwd=tmp_path)
    steps = [(int(n), float(loss)) for n, loss in STEP.findall(done.stdout)]
    assert [n for n, _ in steps] == list(range(1, 11)), done.stdout[-2000:]
    losses = [loss for _, loss in steps]
    assert losses[-1] < 0.8 * losses[0], f"the loss did not fall: {losses}"
    (final_mse,) = map(float, EPOCH_MSE.findall(done.stdout))
    assert final_mse < losses[0]
    assert "with the cupynumeric solver backend" in done.stdout
