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
``ALLOWED`` says why.

The cache folder is ``$MARQUARDT_PEERS_CACHE`` or ``<tmp>/marquardt-peers``; making the
environment needs a package index (about 15 seconds). Without one the tests skip, except
under ``CI=true``, where they fail: on CI the comparison is the point.
"""

from __future__ import annotations

import hashlib
import json
import math
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

SCRIPTS_DIR = Path(__file__).resolve().parent / "perceptrain"
RUNNER = SCRIPTS_DIR / "_run_all.py"
SCRIPTS = sorted(p.stem for p in SCRIPTS_DIR.glob("[a-z]*.py") if p.name != "_run_all.py")
CONSTRAINTS = ROOT / "constraints" / "test.txt"
PEER = "perceptrain==0.1.0"


@dataclass(frozen=True)
class Allowed:
    """A field that may differ: why, and by how much (``rel_tol``; ``None``: any value)."""

    reason: str
    rel_tol: float | None = None


_LAYOUT = (
    "a run folder holds perceptrain's model_<class>_ckpt_<epoch>_device_<device>.pt and "
    "opt_<class>_ckpt_... in both, and here also the resume files (checkpoints/ckpt_<step>.pt), "
    "tensorboard/, metrics.csv and hparams.json, where perceptrain writes the event files "
    "beside the checkpoints; run folders, the checkpoints' epochs and the scalars are "
    "compared on their own"
)
_SHUFFLE = (
    "a shuffled DataLoader is re-sampled by the trainer's DistributedSampler (its own "
    "permutation per epoch from one seed: TrainConfig.seed, or a draw from torch's generator), "
    "the same on every rank, not by the DataLoader's RandomSampler: other batches, so other "
    "losses; steps, epochs and the printed iterations are compared exactly"
)

# What may differ, and why. A key is (script or "*", a regular expression matched against
# the whole path of a field, as ``printed_losses[3][1]`` or ``runs.resume[0].files``;
# ``files#len`` is a list's length).
ALLOWED: dict[tuple[str, str], Allowed] = {
    ("*", r"module"): Allowed("names the package the script ran under"),
    ("*", r"logged.*"): Allowed(
        "log records are each package's own wording (perceptrain logs its accelerator's "
        "set-up at INFO); what users act on is printed, written or returned, compared elsewhere"
    ),
    ("*", r"traceback"): Allowed("only present beside an error, compared as `error`"),
    ("*", r"(.*\.)?files(#len|\[\d+\])?"): Allowed(_LAYOUT),
    ("*", r"metrics\..*metrics\.csv"): Allowed(
        "marquardt's CSV logger (an addition) writes metrics.csv beside the TensorBoard "
        "files; the same scalars are compared in the TensorBoard entries"
    ),
    ("*", r"(.*\.)?global_step"): Allowed(
        "global_step counts the optimizer steps taken, as perceptrain's docstring says; "
        "perceptrain 0.1.0 leaves it at 0 unless a checkpoint was loaded"
    ),
    ("*", r"run_ids(#len|\[\d+\])?"): Allowed(
        "a new run's id counts the runs already in its folder here (1_, 2_, ...), so two "
        "runs started in the same second never share a folder; perceptrain starts at 1 for "
        "every TrainConfig. Run folders are compared, numbered in time order, in run_folders"
    ),
    (
        "two_runs_same_folder",
        r"runs\.resume\[1\]\.(log_folder|current_epoch|full_loss|"
        r"checkpoints(#len|\[\d+\])?)|metrics\.resume(/<run\d>)?(\.train_loss(#len)?)?|"
        r"run_folders(#len|\[\d+\])?|checkpoints(#len|\[\d+\])?",
    ): Allowed(
        "a second run into an explicit log_folder gets its own subfolder there and resumes "
        "only when asked (resume_from), so no run is continued or overwritten unasked; "
        "perceptrain resumes from the latest checkpoint there"
    ),
    ("callback_writer", r"run_folders(#len|\[\d+\])?"): Allowed(
        "with MLflow as the tracking tool and no checkpoint asked for, perceptrain writes "
        "nothing into its run folder, so none appears; here every run folder holds "
        "metrics.csv and hparams.json"
    ),
    ("r3_sampling", r"steps|residual|released_at_epoch_start(\[\d+\]\[1\])?"): Allowed(
        "an epoch here is every batch of a loader with a length; perceptrain 0.1.0 takes one "
        "batch an epoch from a loader whose dataset is not a TensorDataset; and perceptrain "
        "runs deep copies of the configured callbacks, so its R3Sampling renews a copy of "
        "the dataset that the loader never reads (fitness_calls are compared)"
    ),
    ("seed_train", r"printed\[\d+\]"): Allowed(_SHUFFLE + "; printed_losses holds the numbers"),
    ("seed_train", r"printed_losses\[\d+\]\[1\]"): Allowed(_SHUFFLE, rel_tol=0.15),
    ("seed_train", r"printed_losses\[\d+\]\[2\]\.train_loss"): Allowed(_SHUFFLE, rel_tol=0.15),
    # the last batch's loss is one batch of 16 points: it varies with the batches as much as
    # the printed epoch means; the loss on all the data, full_loss, is held to 5 %
    ("seed_train", r"state\.opt_result\.loss"): Allowed(_SHUFFLE, rel_tol=0.15),
    ("seed_train", r"full_loss"): Allowed(_SHUFFLE, rel_tol=0.05),
    ("callback_subclass", r"seen\[\d+\]\.writer"): Allowed(
        "the writer handed to callbacks is marquardt's run logger, one object for all the "
        "run's loggers with perceptrain's writer methods (write, print_metrics, "
        "log_hyperparams, plot, log_model); its class name differs"
    ),
    ("dataloaders_and_test", r"test_default(#len)?"): Allowed(
        "perceptrain 0.1.0's test() without an argument iterates None batches and raises "
        "TypeError; here it uses the test data given to the constructor, as its docstring says"
    ),
    (
        "dataloaders_and_test",
        r"printed(_losses)?\[[23]\](\[\d+\])?(\.train_loss)?|"
        r"metrics\.qml_logs/<run0>\.val_loss\[[12]\]\[1\]|metrics\.qml_logs/<run1>|"
        r"run_folders(#len|\[\d+\])?",
    ): Allowed(
        "a second fit() trains epochs 0..max_iter again in both (steps and epochs are "
        "compared); perceptrain first reloads the newest checkpoint of its folder (here the "
        "one of epoch 0) and writes into the first run's folder, so it trains from older "
        "weights; here it goes on from the model as it is, in a run folder of its own"
    ),
    ("data_helpers", r"to_dataloader_infinite\.full_loss"): Allowed(
        "a loader without a length gives one batch an epoch in both, but here the epochs go "
        "on through one shuffled stream (every sample once before the next shuffle), as for "
        "any stream, where perceptrain starts the iterator afresh each epoch (a new shuffle, "
        "its first batch; a finite stream would give its first batch every epoch): other "
        "batches after epoch 0",
        rel_tol=0.01,
    ),
    ("lr_schedulers", r"schedules\.cosine\.(lr\[\d+\]\[1\]|full_loss)"): Allowed(
        "LRSchedulerCosineAnnealing anneals each group from its first rate to min_lr "
        "(cos over the epochs); perceptrain 0.1.0 recomputes from the current rate at every "
        "call, so its rate compounds and collapses early (0.0021 against 0.0035 at epoch 6 "
        "of 12); the other three schedules are compared exactly"
    ),
}

# Lines only marquardt prints, and why; removed from its ``printed`` before comparing.
EXTRA_LINES: dict[str, str] = {
    r"marquardt\.trainer: ": (
        "marquardt's opening line names the loop, launcher, world size, device, epochs and "
        "run folder (the launch recipes and their tests read it)"
    ),
}

# Float agreement: both sides compute in float64; TensorBoard stores float32; printed
# values have 7 decimals.
REL_TOL = 1e-5
ABS_TOL = 2e-7
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


def _allowed(script: str, path: str) -> Allowed | None:
    for (where, pattern), allowed in ALLOWED.items():
        if where in ("*", script) and re.fullmatch(pattern, path):
            return allowed
    return None


def differences(script: str, ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where ``ours`` (marquardt) and ``theirs`` (perceptrain) differ, but for ``ALLOWED``."""
    allowed = _allowed(script, path) if path else None
    here = path or "<line>"
    if allowed is not None:
        if allowed.rel_tol is None or _same_number(ours, theirs, allowed.rel_tol):
            return []
        return [
            f"{here}: {_short(ours)} here, {_short(theirs)} in perceptrain (allowed: "
            f"within {allowed.rel_tol:.0%}, because {allowed.reason})"
        ]
    if isinstance(theirs, dict) and isinstance(ours, dict):
        found = []
        for key in sorted(set(theirs) | set(ours)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in ours:
                if not _allowed(script, sub):
                    found.append(f"{sub}: missing here; perceptrain: {_short(theirs[key])}")
            elif key not in theirs:
                if not _allowed(script, sub):
                    found.append(f"{sub}: only here: {_short(ours[key])}")
            else:
                found += differences(script, ours[key], theirs[key], sub)
        return found
    if isinstance(theirs, list) and isinstance(ours, list):
        found = []
        if len(theirs) != len(ours) and not _allowed(script, f"{path}#len"):
            found.append(
                f"{here}: {len(ours)} items here, {len(theirs)} in perceptrain; "
                f"here {_short(ours)}, perceptrain {_short(theirs)}"
            )
            return found
        for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            found += differences(script, a, b, f"{path}[{index}]")
        return found
    if _same_number(ours, theirs) or ours == theirs:
        return []
    return [f"{here}: {_short(ours)} here, {_short(theirs)} in perceptrain"]


def _same_number(a: Any, b: Any, rel_tol: float = REL_TOL) -> bool:
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, numbers) and isinstance(b, numbers):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=ABS_TOL)
    return False


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 300 else text[:297] + "..."


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
