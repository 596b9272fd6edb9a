"""Helpers shared by the integration tests: paths, environments, processes, output parsing.

Every process started here runs in its own session (process group) with a timeout; on a
timeout or any other error the whole group is killed, so no test leaves processes behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: The seeds' train.py with only its import lines changed.
SEED_TRAIN = SCRIPTS / "train.py"
#: The same command line, converging, and printing one ``fit-rank:`` line per process.
FIT = SCRIPTS / "fit.py"
LM_EXAMPLE = ROOT / "examples" / "sinc_lm.py"
STUB_SOURCE = ROOT / "packages" / "core-solver" / "tests" / "legate_support" / "libcuda_stub.c"


def load_tool(name: str) -> ModuleType:
    """The module ``tools/<name>.py`` (the tools are scripts, not an installed package)."""
    path = ROOT / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


# "P  0|cpu    | Iteration      10| Train_Loss: 0.5336940 -" (rank 0, every print_every
# epochs: perceptrain's PrintMetrics line, the epoch's mean loss)
_LOSS = re.compile(r"P +0\|\S+ *\| Iteration +(\d+)\| Train_Loss: ([-+0-9.eE]+|nan|inf) -")
# "marquardt.trainer: DDP loop (gloo), torchrun, world size 2, device cpu, epochs 0-60; ..."
_DESCRIBE = re.compile(
    r"marquardt\.trainer: (?P<loop>DDP loop \(\w+\)|LM loop), (?P<where>.+?), "
    r"world size (?P<world>\d+), "
    r"device (?P<device>\S+), epochs 0-(?P<epochs>\d+)"
)
# "epoch   1 step     3  loss 4.010e-02  time    84.2 ms  damping 1.0e-03  attempts 2"
_LM_STEP = re.compile(r"epoch +\d+ step +(\d+) +loss ([-+0-9.eE]+|nan|inf) ")
# "... on cpu with the cupynumeric solver backend."
_LM_BACKEND = re.compile(r"Summary: .* with the (\w+) solver backend")
# A number as Python prints a float. Ranks share one stdout, and a line of one rank can be
# followed by another's with no line break between them: numbers are matched as numbers,
# never as "anything up to a space".
FLOAT = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan))"
# "lm-params: rank 1 sum -325.26 norm 169.60" (integration_tests/scripts/fit_lm.py)
_LM_PARAMS = re.compile(rf"lm-params: rank (\d+) sum {FLOAT} norm {FLOAT}")
# "fit-rank: rank 1 local_rank 1 world_size 2 host vm cuda_visible_devices 0,1"
_RANK = re.compile(
    r"fit-rank: rank (\d+) local_rank (\d+) world_size (\d+) host (\S+) "
    r"cuda_visible_devices ([\d,]+|-)"
)


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment for a child: this interpreter's bin first, no outer Slurm job.

    The bin folder of ``sys.executable`` (the nox environment) goes first on PATH so that
    ``python3``, ``torchrun``, ``legate`` and ``marquardt-devices`` in the recipes are the
    ones under test; SLURM_* of an enclosing job would mislead the trainer.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", ""), "/usr/sbin", "/sbin"])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    env.update(extra or {})
    return env


@dataclass
class Finished:
    command: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def describe(self) -> str:
        return (
            f"`{' '.join(self.command)}` exited {self.returncode}\n--- stdout\n"
            f"{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-6000:]}"
        )


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def start(cmd: Sequence[str], *, env: Mapping[str, str], cwd: Path) -> subprocess.Popen[str]:
    """Start ``cmd`` in a new session (so its whole process tree can be killed)."""
    return subprocess.Popen(
        list(cmd), env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


def wait_all(
    procs: Sequence[subprocess.Popen[str]], commands: Sequence[Sequence[str]], timeout: float
) -> list[Finished]:
    """Wait for every process; on a timeout kill them all and fail with their output."""
    results: list[Finished] = []
    try:
        for proc, cmd in zip(procs, commands, strict=True):
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for p in procs:
                    _kill_group(p)
                out, err = proc.communicate()
                raise AssertionError(
                    f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s and was killed "
                    f"(with its process group).\n--- stdout\n{out[-4000:]}\n--- stderr\n"
                    f"{err[-4000:]}"
                ) from None
            results.append(Finished(list(cmd), proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_group(proc)
                proc.communicate()
    return results


def run(
    cmd: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float = 300.0
) -> Finished:
    """Run ``cmd`` to the end (or kill its process group after ``timeout`` seconds)."""
    return wait_all([start(cmd, env=env, cwd=cwd)], [cmd], timeout)[0]


def legate_cpu_env(stub: Path) -> dict[str, str]:
    """Variables that make Legate run on its CPUs, with the driver stub in ``stub``.

    The stub goes first on LD_LIBRARY_PATH so that it shadows any real driver; Legate does
    not size itself to the machine (``LEGATE_AUTO_CONFIG=0``): the recipes' flags decide.
    """
    previous = os.environ.get("LD_LIBRARY_PATH", "")
    return {
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(stub), previous) if p),
        "LEGATE_AUTO_CONFIG": "0",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class RankLine:
    rank: int
    local_rank: int
    world_size: int
    host: str
    cuda_visible_devices: str


def losses(text: str) -> list[tuple[int, float]]:
    """(epoch, loss) of every progress line the trainer printed."""
    return [(int(m[1]), float(m[2])) for m in _LOSS.finditer(text)]


def describe_lines(text: str) -> list[dict[str, str]]:
    """The trainer's opening line(s): loop, launcher, world size, device, last epoch."""
    return [m.groupdict() for m in _DESCRIBE.finditer(text)]


def rank_lines(text: str) -> list[RankLine]:
    """The ``fit-rank:`` lines of ``scripts/fit.py``, one per process."""
    return [RankLine(int(m[1]), int(m[2]), int(m[3]), m[4], m[5]) for m in _RANK.finditer(text)]


def assert_trained(text: str, *, world_size: int, epochs: int, print_every: int) -> None:
    """The run printed every progress line (epochs 1 to ``epochs``), its losses are finite,
    and the loss fell.

    ``scripts/fit.py`` reaches about 0.2 from 0.53 in 60 Adam steps (mean over ranks);
    a fall to below 70 % of the first printed loss cannot happen without training.
    """
    found = losses(text)
    assert [s for s, _ in found] == list(range(print_every, epochs + 1, print_every)), text
    values = [v for _, v in found]
    assert all(math.isfinite(v) for v in values), values
    assert values[-1] < 0.7 * values[0], f"the loss did not fall: {values}"
    heads = describe_lines(text)
    assert len(heads) == 1, f"expected one opening line (rank 0 only), got {heads}\n{text}"
    assert int(heads[0]["world"]) == world_size, heads


def lm_params(text: str) -> dict[int, tuple[str, str]]:
    """rank → (sum, norm) of its final parameters, from the ``lm-params`` lines."""
    return {int(rank): (total, norm) for rank, total, norm in _LM_PARAMS.findall(text)}


def assert_ranks(text: str, world_size: int) -> list[RankLine]:
    """Every rank 0..world_size-1 reported once, each with the same world size."""
    lines = rank_lines(text)
    assert sorted(r.rank for r in lines) == list(range(world_size)), text
    assert {r.world_size for r in lines} == {world_size}, lines
    return lines


def assert_lm_fit(text: str, *, steps: int, backend: str = "cupynumeric") -> list[float]:
    """examples/sinc_lm.py made ``steps`` LM steps on ``backend`` and its loss fell.

    One epoch of the tutorial (10 steps of 10000 samples) takes the batch loss from about
    4.3e-2 to 2.8e-2 on CPU; below 80 % of the first step's loss needs accepted LM steps.
    """
    found = [(int(m[1]), float(m[2])) for m in _LM_STEP.finditer(text)]
    assert [s for s, _ in found] == list(range(1, steps + 1)), text[-4000:]
    values = [v for _, v in found]
    assert all(math.isfinite(v) for v in values), values
    assert values[-1] < 0.8 * values[0], f"the LM loss did not fall: {values}"
    used = _LM_BACKEND.search(text)
    assert used is not None and used[1] == backend, text[-2000:]
    return values
