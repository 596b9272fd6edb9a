"""marquardt.trainer against perceptrain 0.1.0 itself: the same scripts, what a user sees.

Each script in ``integration_tests/perceptrain/`` is a perceptrain user's everyday usage (the
seeds' ``train.py``, callbacks, early stopping, custom losses, hooks, data helpers,
nevergrad, two runs into one folder). It prints one JSON line: optimizer steps taken,
forward passes, the printed loss lines, the files written, the scalars in them, the
checkpoints' epochs, the callbacks' and hooks' calls, the early-stopping decisions, the
final loss. The scripts run once under perceptrain, in a virtual environment of its own
(perceptrain 0.1.0, nevergrad and torch as pinned in ``constraints/test.txt``; made once and
kept in a cache folder keyed by those versions), and once under ``marquardt.trainer`` in
this interpreter. The perceptrain environment is layered on this interpreter's packages (a
``.pth`` file names its site-packages): torch, NumPy and whatever else both need are the
same builds on both sides and on the disk once, and the environment holds only what
perceptrain adds (about 120 MB instead of 1.5 GB). Each test compares one script's two
lines field by field. Numbers must agree to float rounding; a field may differ only where
``ALLOWED`` (``perceptrain_rules.py``) says why.

The cache folder is ``$MARQUARDT_PEERS_CACHE`` or ``<tmp>/marquardt-peers``; making the
environment needs a package index (about 15 seconds). Without one the tests skip, except
under ``CI=true``, where they fail: on CI the comparison is the point.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from _support import ROOT, base_env
from perceptrain_rules import EXTRA_LINES, differences

SCRIPTS_DIR = Path(__file__).resolve().parent / "perceptrain"
RUNNER = SCRIPTS_DIR / "_run_all.py"
SCRIPTS = sorted(p.stem for p in SCRIPTS_DIR.glob("[a-z]*.py") if p.name != "_run_all.py")
CONSTRAINTS = ROOT / "constraints" / "test.txt"
PEER = "perceptrain==0.1.0"


# Index hosts pip fails to reach, or that lack the packages asked for.
_NO_INDEX = re.compile(
    r"No matching distribution found|Could not find a version that satisfies|"
    r"Failed to establish a new connection|Temporary failure in name resolution|"
    r"Network is unreachable|ProxyError|Max retries exceeded"
)


def _pins(names: tuple[str, ...]) -> list[str]:
    """``name==version`` of each of ``names`` as ``constraints/test.txt`` pins it."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if "==" in requirement:
            name, version = requirement.split("==", 1)
            pins[name.strip().lower()] = f"{name.strip()}=={version.strip()}"
    missing = [n for n in names if n not in pins]
    assert not missing, f"{CONSTRAINTS} pins no version of {missing}"
    return [pins[n] for n in names]


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"{message}\n(CI=true: the perceptrain comparison must run on CI)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def perceptrain_python() -> Path:
    """The interpreter of a virtual environment with perceptrain, nevergrad and pinned torch."""
    requirements = [PEER, *_pins(("torch", "nevergrad"))]
    shared = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    key = hashlib.sha256(
        "\n".join([*requirements, CONSTRAINTS.read_text(), sys.version, *shared]).encode()
    ).hexdigest()[:16]
    cache = Path(
        os.environ.get("MARQUARDT_PEERS_CACHE") or Path(tempfile.gettempdir()) / "marquardt-peers"
    )
    venv = cache / f"perceptrain-0.1.0-py{sys.version_info[0]}{sys.version_info[1]}-{key}"
    python = venv / "bin" / "python"
    done = venv / ".complete"
    if done.exists() and python.exists():
        return python
    cache.mkdir(parents=True, exist_ok=True)
    # pip would count packages on this interpreter's PYTHONPATH as installed there
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    t0 = time.monotonic()
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert made.returncode == 0, f"python -m venv {venv} failed:\n{made.stderr}"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    ).stdout.strip()  # fmt: skip
    # This interpreter's packages, after the environment's own (module docstring).
    (Path(own) / "_marquardt_shared.pth").write_text("".join(f"{p}\n" for p in shared))
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-c",
         str(CONSTRAINTS), *requirements],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )  # fmt: skip
    if installed.returncode != 0:
        output = installed.stdout[-3000:] + installed.stderr[-3000:]
        if _NO_INDEX.search(output):
            _unavailable(
                f"no package index provides {requirements}, so perceptrain cannot be "
                f"installed beside marquardt:\n{output}\nHINT: make a package index "
                "reachable (PIP_INDEX_URL), or point MARQUARDT_PEERS_CACHE at a cache that "
                "holds the environment"
            )
        pytest.fail(f"pip install {' '.join(requirements)} into {venv} failed:\n{output}")
    done.write_text(f"{' '.join(requirements)}\nmade in {time.monotonic() - t0:.0f} s\n")
    return python


@dataclass
class Side:
    """One package's JSON line per script, or what went wrong running the script."""

    module: str
    results: dict[str, dict[str, Any]]
    failures: dict[str, str]
    seconds: float


def _run_side(python: Path, module: str, out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The runner for one package; each script's output goes to files in ``out``."""
    command = [str(python), str(RUNNER), str(out), *[f"{s}.py" for s in SCRIPTS]]
    env = {**env, "TRAINER_MODULE": module, "TMPDIR": str(out)}
    with (out / "runner.err").open("w") as stderr:
        return subprocess.Popen(
            command, env=env, cwd=out, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True,
        )  # fmt: skip


def _collect(module: str, out: Path, proc: subprocess.Popen[bytes], seconds: float) -> Side:
    stderr = (out / "runner.err").read_text()
    assert proc.returncode == 0, f"{RUNNER} under {module} exited {proc.returncode}:\n{stderr}"
    results, failures = {}, {}
    for script in SCRIPTS:
        status = (out / f"{script}.rc").read_text().split()[0]
        lines = (out / f"{script}.out").read_text().splitlines()
        err = (out / f"{script}.err").read_text()
        if status != "0" or not lines:
            failures[script] = (
                f"exit status {status}\n--- stdout\n{lines[-20:]}\n--- stderr\n{err[-3000:]}"
            )
            continue
        results[script] = json.loads(lines[-1])
    return Side(module, results, failures, seconds)


@pytest.fixture(scope="session")
def sides(
    perceptrain_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Side, Side]]:
    """Every script under perceptrain and under marquardt.trainer, the two runs side by side."""
    env = base_env({"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
    peer_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    out_p = tmp_path_factory.mktemp("perceptrain")
    out_m = tmp_path_factory.mktemp("marquardt")
    t0 = time.monotonic()
    procs = [
        _run_side(perceptrain_python, "perceptrain", out_p, peer_env),
        _run_side(Path(sys.executable), "marquardt.trainer", out_m, env),
    ]
    try:
        for proc in procs:
            proc.wait(timeout=600)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.monotonic() - t0
    print(
        f"\nperceptrain comparison: {len(SCRIPTS)} scripts under both packages in {seconds:.0f} s"
    )
    yield (
        _collect("perceptrain", out_p, procs[0], seconds),
        _collect("marquardt.trainer", out_m, procs[1], seconds),
    )


def test_the_scripts_run_under_perceptrain(sides: tuple[Side, Side]) -> None:
    """The reference itself: every script runs to its JSON line under perceptrain."""
    perceptrain, _ = sides
    assert not perceptrain.failures, "\n\n".join(
        f"{name}: {text}" for name, text in perceptrain.failures.items()
    )
    errors = {k: v["error"] for k, v in perceptrain.results.items() if "error" in v}
    assert not errors, f"scripts that raise under perceptrain itself: {errors}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_marquardt_shows_what_perceptrain_shows(script: str, sides: tuple[Side, Side]) -> None:
    perceptrain, marquardt = sides
    if script in perceptrain.failures:
        pytest.fail(f"{script} did not run under perceptrain: {perceptrain.failures[script]}")
    assert script not in marquardt.failures, (
        f"{script} did not run under marquardt.trainer: {marquardt.failures[script]}"
    )
    ours = dict(marquardt.results[script])
    ours["printed"] = [
        line for line in ours.get("printed", []) if not any(re.match(p, line) for p in EXTRA_LINES)
    ]
    found = differences(script, ours, perceptrain.results[script])
    if "error" in ours:  # the first thing a user meets
        found.insert(0, f"raised {ours['error']}\n{ours.get('traceback', '')}")
    assert not found, (
        f"integration_tests/perceptrain/{script}.py: {len(found)} difference(s) from "
        "perceptrain 0.1.0 (marquardt first, then perceptrain):\n  " + "\n  ".join(found[:40])
    )


CROSS = SCRIPTS_DIR / "_cross_checkpoint.py"


def _side(python: Path, module: str, *args: str, cwd: Path) -> dict[str, Any]:
    env = base_env({"TRAINER_MODULE": module, "MPLBACKEND": "Agg"})
    if module == "perceptrain":
        env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(python), str(CROSS), *args],
        capture_output=True, text=True, timeout=300, check=False, env=env, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, f"{module} {args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    ("writer", "reader"),
    [("perceptrain", "marquardt.trainer"), ("marquardt.trainer", "perceptrain")],
)
def test_a_run_folder_written_by_one_side_loads_in_the_other(
    perceptrain_python: Path, tmp_path: Path, writer: str, reader: str
) -> None:
    """The trainer's run folder of one package (a checkpoint every 3 epochs, and the best
    pair by ``write_checkpoint``) loads with the other's ``load_checkpoint``: the newest
    one, then the best by name, the same weights and Adam's step count."""
    python = {"perceptrain": perceptrain_python, "marquardt.trainer": Path(sys.executable)}
    runs = tmp_path / "runs"
    written = _side(python[writer], writer, "write", str(runs), cwd=tmp_path)
    loaded = _side(python[reader], reader, "load", str(runs), cwd=tmp_path)
    assert loaded["files"] == [
        "model_Sequential_ckpt_000_device_cpu.pt",
        "model_Sequential_ckpt_003_device_cpu.pt",
        "model_Sequential_ckpt_best_device_cpu.pt",
        "opt_Adam_ckpt_000_device_cpu.pt",
        "opt_Adam_ckpt_003_device_cpu.pt",
        "opt_Adam_ckpt_best_device_cpu.pt",
    ]
    assert loaded["latest"]["iteration"] == 3
    for which in ("latest", "best"):
        assert loaded[which]["weights"] == written["weights"], which
        assert loaded[which]["adam_steps"] == written["adam_steps"] == [16] * 4, which


def test_the_comparison_finds_what_differs() -> None:
    """The comparison itself: a step count, a missing field, a printed line are found; an
    allowed field is not, and an allowed tolerance still binds."""
    theirs = {"steps": 357, "printed": ["a"], "calls": {"x": [2, 4]}, "logged": ["p"]}
    ours = {"steps": 50, "printed": ["a", "b"], "logged": ["m"]}
    found = differences("any", ours, theirs)
    assert any(f.startswith("steps: 50 here, 357") for f in found), found
    assert any(f.startswith("calls: missing here") for f in found), found
    assert any(f.startswith("printed: 2 items here, 1") for f in found), found
    assert not any(f.startswith("logged") for f in found), found
    near = differences("seed_train", {"full_loss": 0.21}, {"full_loss": 0.20})
    far = differences("seed_train", {"full_loss": 0.4}, {"full_loss": 0.20})
    assert near == [] and len(far) == 1, (near, far)


_PERCEPTRAIN_NAMES = """
import dataclasses, json
import perceptrain.callbacks, perceptrain.data
from perceptrain import Trainer, TrainConfig
names = [f.name for f in dataclasses.fields(TrainConfig) if not f.name.startswith("_")]
names += perceptrain.callbacks.__all__
names += [n for n in dir(Trainer) if not n.startswith("_")]
names += ["current_epoch", "global_step", "opt_result"]  # set in Trainer.__init__
names += [n for n in ("to_dataloader", "DictDataLoader", "InfiniteTensorDataset", "R3Dataset",
                      "GenerativeIterableDataset", "OptimizeResult") if hasattr(perceptrain.data, n)]
print(json.dumps(sorted(set(names))))
"""


def test_the_docs_page_names_every_perceptrain_name(
    perceptrain_python: Path, tmp_path: Path
) -> None:
    """docs/coming-from-perceptrain.md has a status for every field, callback, Trainer
    method and data helper that perceptrain 0.1.0 itself lists."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    listed = subprocess.run(
        [str(perceptrain_python), "-c", _PERCEPTRAIN_NAMES],
        capture_output=True, text=True, timeout=300, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-3000:]
    names = json.loads(listed.stdout.splitlines()[-1])
    page = (ROOT / "docs" / "coming-from-perceptrain.md").read_text(encoding="utf-8")
    missing = [
        name for name in names if not re.search(rf"`[^`\n]*\b{re.escape(name)}\b[^`\n]*`", page)
    ]
    assert len(names) > 60, names
    assert not missing, (
        f"docs/coming-from-perceptrain.md gives no status for {missing}. HINT: add a row "
        "to its table: same, differs (how) or not provided (why)"
    )
