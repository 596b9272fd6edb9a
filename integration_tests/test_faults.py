"""Faults a user meets, with real processes: a diverging run under the torchrun recipe,
Ctrl-C at random moments of a plain ``python`` run, and a run folder on a file system that
fills up. Each ends with one clear error and leaves every checkpoint whole and finite.
"""

from __future__ import annotations

import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from _support import FLOAT, LAUNCH, SCRIPTS, base_env, losses, run, start

FAULT_RUN = SCRIPTS / "fault_run.py"
CPU = {"COMPUTE_SETUP": "cpu", "BACKEND": "gloo"}
#: SGD that overflows: the loss is finite for epochs 1 to 4, inf in epoch 5 (3 batches of
#: 20 per rank and epoch with 2 ranks).
DIVERGING = ["--optimizer", "sgd", "--lr", "0.3", "--scale", "10", "--batch_size", "20"]
# "fault-nonfinite: rank 1 step 16 epoch 5 batch 0" (scripts/fault_run.py)
_NONFINITE = re.compile(r"fault-nonfinite: rank (\d+) step (\d+) epoch (\d+) batch (\d+)")
# "fault-finished: rank 0 epoch 12 finite True sum -3.0625" (each rank's line may run into
# the other's: the sum is matched as a number)
_FINISHED = re.compile(rf"fault-finished: rank (\d+) epoch (\d+) finite (True|False) sum {FLOAT}")
# "non-finite training at step 16 (epoch 5, batch 0)" (NonFiniteLossError)
_AT_STEP = re.compile(r"NonFiniteLossError: non-finite training at step (\d+) \(epoch (\d+), batch")
# "the last checkpoint, runs/.../ckpt_000000015.pt, is finite"
_LAST_FINITE = re.compile(r"the last checkpoint, (\S+\.pt), is finite")


def _checkpoints(root: Path) -> dict[Path, dict[str, Any]]:
    """Every resume checkpoint under ``root`` (``checkpoints/*.pt``; perceptrain's pairs
    beside them are written after each), loaded as a user would (``weights_only``)."""
    return {
        path: torch.load(path, map_location="cpu", weights_only=True)
        for path in sorted(root.rglob("*.pt"))
        if path.parent.name == "checkpoints"
    }


def _assert_finite(found: dict[Path, dict[str, Any]]) -> None:
    for path, data in found.items():
        model = data["model"]
        assert isinstance(model, dict), path
        assert all(bool(torch.isfinite(v).all()) for v in model.values()), f"{path} is not finite"


def _newest(found: dict[Path, dict[str, Any]]) -> Path:
    return max(found, key=lambda path: int(found[path]["step"]))


def _no_temporary_files(root: Path) -> None:
    stray = [str(p.relative_to(root)) for p in root.rglob("*") if ".tmp" in p.name]
    assert not stray, f"temporary files left in the run folder: {stray}"


def _python(*args: str) -> list[str]:
    return [sys.executable, str(FAULT_RUN), "--compute_setup", "cpu", "--backend", "gloo", *args]


# --------------------------------------------------------------------- a diverging run


@pytest.mark.multiprocess
def test_torchrun_diverging_run_stops_on_both_ranks_with_finite_checkpoints(
    tmp_path: Path,
) -> None:
    env = base_env({**CPU, "NPROCS": "2", "SCRIPT": str(FAULT_RUN)})
    cmd = [
        "bash",
        str(LAUNCH / "torchrun" / "single_node.sh"),
        *DIVERGING,
        *("--max_iter", "30", "--keep_checkpoints", "50"),
    ]
    done = run(cmd, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode != 0, done.describe()
    # Each rank stops at the same step with NonFiniteLossError, naming step and epoch.
    stops = {int(m[1]): (int(m[2]), int(m[3]), int(m[4])) for m in _NONFINITE.finditer(done.stdout)}
    assert sorted(stops) == [0, 1], done.describe()
    assert stops[0] == stops[1], stops
    step, epoch, _ = stops[0]
    named = {(int(s), int(e)) for s, e in _AT_STEP.findall(done.stderr)}
    assert named == {(step, epoch)}, done.describe()
    # The losses printed before it were finite, and the run did not go on after it.
    printed = losses(done.stdout)
    assert printed and all(math.isfinite(v) for _, v in printed), printed
    assert max(e for e, _ in printed) < epoch, (printed, epoch)
    # Every checkpoint loads and is finite; the newest is the one of the epoch before the
    # fault (one per epoch, none after it), and rank 0's error names it.
    found = _checkpoints(tmp_path / "runs")
    assert found, f"no checkpoint was written before epoch {epoch}"
    _assert_finite(found)
    newest = _newest(found)
    assert int(found[newest]["current_epoch"]) == epoch - 1, (newest, epoch)
    assert int(found[newest]["step"]) < step, (newest, step)
    last = _LAST_FINITE.search(done.stderr)
    assert last is not None and (tmp_path / last[1]).resolve() == newest.resolve(), done.stderr


@pytest.mark.multiprocess
def test_torchrun_diverging_run_with_skip_ends_finite(tmp_path: Path) -> None:
    """``on_nonfinite="skip"`` undoes every overflowing step: the run ends (fewer than 25
    skips in a row) with the same finite parameters on both ranks."""
    env = base_env({**CPU, "NPROCS": "2", "SCRIPT": str(FAULT_RUN)})
    cmd = ["bash", str(LAUNCH / "torchrun" / "single_node.sh"), *DIVERGING,
           "--on_nonfinite", "skip", "--max_iter", "9"]  # fmt: skip
    done = run(cmd, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.describe()
    assert "the batch is skipped and the step undone" in done.stderr, done.describe()
    finished = {int(m[1]): (int(m[2]), m[3], m[4]) for m in _FINISHED.finditer(done.stdout)}
    assert sorted(finished) == [0, 1], done.describe()
    assert finished[0][:2] == (9, "True") and finished[0] == finished[1], finished
    found = _checkpoints(tmp_path / "runs")
    assert found
    _assert_finite(found)


# --------------------------------------------------------------------------- Ctrl-C

#: Runs interrupted one after the other in one run folder, each resuming the one before.
INTERRUPTS = 8


def _interrupt_once(
    cmd: list[str], cwd: Path, rng: random.Random
) -> tuple[subprocess.CompletedProcess[str], bool, float]:
    """Start ``cmd``, measure its epoch from its first three progress lines, send SIGINT a
    random time within the next two epochs; (outcome, whether it was still training, the
    measured epoch in seconds)."""
    proc = start(cmd, env=base_env(), cwd=cwd)
    assert proc.stdout is not None
    seen: list[str] = []
    stamps: list[float] = []
    try:
        while len(stamps) < 3:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if losses(line):
                stamps.append(time.monotonic())
        if len(stamps) < 3:
            out, err = proc.communicate(timeout=60)
            raise AssertionError(f"no three epochs printed:\n{''.join(seen)}{out}\n{err}")
        epoch_s = (stamps[2] - stamps[0]) / 2
        time.sleep(rng.uniform(0.0, 2.0 * epoch_s))
        training = proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    done = subprocess.CompletedProcess(cmd, proc.returncode, "".join(seen) + out, err)
    return done, training, epoch_s


def _where(traceback: str) -> str:
    """The part of the run that the interrupt's traceback shows it landed in."""
    if "atomic_save" in traceback:
        return "checkpoint write"
    if "optimize_step.py" in traceback or "_nonfinite.py" in traceback:
        return "optimizer step"
    if "dataloader.py" in traceback:
        return "data loading"
    return "elsewhere"


def test_ctrl_c_at_random_moments_then_resume(tmp_path: Path) -> None:
    rng = random.Random(28)
    root = tmp_path / "runs"
    common = ["--hidden", "64", "--root_folder", str(root)]
    landed = 0
    places: Counter[str] = Counter()
    epochs: list[float] = []
    for i in range(INTERRUPTS):
        cmd = _python(*common, *(["--resume"] if i else []))
        done, training, epoch_s = _interrupt_once(cmd, tmp_path, rng)
        epochs.append(epoch_s)
        landed += training
        text = f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        assert training, f"run {i} ended before the interrupt:\n{text}"
        # Python's own ending for an uncaught interrupt: the traceback, then the name.
        assert done.returncode in (-signal.SIGINT, 128 + signal.SIGINT, 1), text
        assert done.stderr.rstrip().splitlines()[-1] == "KeyboardInterrupt", text
        assert "Traceback (most recent call last)" in done.stderr, text
        for wrong in ("InvalidStateError", "RuntimeError", "terminate called"):
            assert wrong not in done.stderr, text
        places[_where(done.stderr)] += 1
        _no_temporary_files(root)
        found = _checkpoints(root)
        assert found, f"no checkpoint after run {i}:\n{text}"
        _assert_finite(found)
    print(
        f"\nctrl-c: {INTERRUPTS} sent, {landed} inside training, all KeyboardInterrupt; "
        f"landed in {dict(places)}; epoch {min(epochs) * 1e3:.0f}-{max(epochs) * 1e3:.0f} ms"
    )
    # A new process resumes from the newest checkpoint and finishes two epochs later.
    found = _checkpoints(root)
    newest = found[_newest(found)]
    start_epoch = int(newest["current_epoch"])
    last = start_epoch + 2
    done = run(_python(*common, "--resume", "--max_iter", str(last)), env=base_env(), cwd=tmp_path)
    assert done.returncode == 0, done.describe()
    assert [e for e, _ in losses(done.stdout)] == [start_epoch + 1, last], done.describe()
    assert re.search(rf"fault-finished: rank 0 epoch {last} finite True", done.stdout)
    _no_temporary_files(root)
    _assert_finite(_checkpoints(root))


# ------------------------------------------------------------------- a full file system


def _mount_tmpfs(folder: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` on ``folder``; None, or why it cannot be."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return f"`mount -t tmpfs` failed here: {done.stderr.strip()}"
    return None


def test_a_run_folder_that_fills_up_ends_naming_the_last_intact_checkpoint(
    tmp_path: Path,
) -> None:
    """Every checkpoint is kept, so 256 KiB fill up within a few epochs whatever a
    checkpoint's size: the 1-72-72-1 network with Adam's moments takes about 90 KiB in
    the resume file and as much again in perceptrain's pair beside it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    why = _mount_tmpfs(disk, "256k")
    if why is not None:
        pytest.skip(f"no small file system for the run folder: {why}")
    try:
        root = disk / "runs"
        cmd = _python(
            "--hidden", "72", "--root_folder", str(root), "--max_iter", "30",
            "--keep_checkpoints", "50",
        )  # fmt: skip
        done = run(cmd, env=base_env(), cwd=tmp_path, timeout=120)
        assert done.returncode != 0, done.describe()
        error = re.search(r"marquardt\.trainer\._errors\.(CheckpointWriteError|RunFilesError): (.*)",
                          done.stderr)  # fmt: skip
        assert error is not None, done.describe()
        text = error[2]
        assert "No space left on device" in text and "HINT:" in text, text
        target = re.search(r"cannot write the \S+ (\S+\.pt):", text)
        assert target is not None and target[1].startswith(str(root)), text
        needed = re.search(
            r"it needed about .*? \((\d+) bytes\), and .*? \((\d+) bytes\) are free", text
        )
        assert needed is not None and int(needed[2]) < int(needed[1]), text
        last = re.search(r"The last intact checkpoint is (\S+\.pt)\.", text)
        assert last is not None, text
        found = _checkpoints(root)
        newest = _newest(found)
        assert Path(last[1]) == newest, (last[1], sorted(found))
        _assert_finite(found)  # the last intact one among them, whole and loading
        _no_temporary_files(root)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30, check=False)
