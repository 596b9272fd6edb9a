"""What a perceptrain user sees of one training script, as one JSON line.

Each script in this folder is a perceptrain user's everyday usage. It runs unchanged under
perceptrain 0.1.0 or under ``marquardt.trainer``: the environment variable
``TRAINER_MODULE`` names the package its ``perceptrain...`` imports resolve to
(``perceptrain`` or ``marquardt.trainer``), as a user changes the import lines following
docs/coming-from-perceptrain.md (``IMPORTS``).

``run(main)`` runs ``main`` in a fresh temporary folder with the default dtype float64 and
every random generator seeded, captures what it prints, and prints one JSON line (the last
line of stdout) with what a user sees: optimizer steps taken, forward passes, the printed
loss lines, the files written under the folder (each ``<id>_<time>_<pid>`` run subfolder
shown as ``<run0>``, ``<run1>``... in time order; the ids apart, in ``run_ids``), the run
folders, the scalars written to TensorBoard event files and CSV files, the numbers of the
checkpoints, and what ``main`` returns (callbacks' calls, early-stopping decisions, ...).
An exception becomes ``{"error": "<type>: <message>"}`` beside what was seen until then.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import json
import logging
import math
import os
import random
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

MODULE = os.environ.get("TRAINER_MODULE", "marquardt.trainer")
SEED = 0

# "1_20261125T232000_1a2b" (perceptrain's <run id>_<timestamp>_<pid in hex>)
_SUBFOLDER = re.compile(r"(\d+)_\d{8}T\d{6}_[0-9a-f]+")
_MASKED_RUN = re.compile(r"<run\d+>")
_EVENTS = re.compile(r"events\.out\.tfevents\..*")
# TensorBoard's add_hparams writes into a subfolder named by the time: "1795649073.6431792"
_HPARAMS = re.compile(r"(?<![\w.])\d{9,}\.\d+(?![\w.])")
# perceptrain's model checkpoints: "model_Sequential_ckpt_005_device_cpu.pt", "..._ckpt_best_..."
_CKPT = re.compile(r"^model_.*_ckpt_(\d+|best)_device_")
_NAMED = re.compile(r"([A-Za-z_][\w]*)\s*:\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))\b")
_ITERATION = re.compile(r"(?:iteration|epoch)\s*:?\s*(\d+)", re.IGNORECASE)
_LOSS = re.compile(r"loss\s*:?\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))", re.IGNORECASE)
# rich's progress bar, when it renders into a captured stream
_PROGRESS = re.compile(r"━|\bTraining\b.*%|\bValidation\b.*%")
# a log record rendered by rich's handler ("2026-01-01 00:00:00 INFO     text   file.py:12"),
# and the indented lines it wraps onto; records are collected apart, in ``logged``
_LOG_HEAD = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)?\s*(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s"
)
_LOG_WRAP = re.compile(r"^\s{20,}\S")


# perceptrain's modules and where marquardt.trainer has them (the docs page's import table);
# a module not listed keeps its name under the package.
IMPORTS = {
    "marquardt.trainer": {
        "": "marquardt.trainer",
        "callbacks": "marquardt.trainer",
        "data": "marquardt.trainer.data",
        "optimize_step": "marquardt.trainer.optimize_step",
        "types": "marquardt.trainer",
    }
}


def api(submodule: str = "") -> ModuleType:
    """``perceptrain.<submodule>`` under the package being compared."""
    default = MODULE if not submodule else f"{MODULE}.{submodule}"
    return importlib.import_module(IMPORTS.get(MODULE, {}).get(submodule, default))


def seed_everything() -> None:
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)


def sine_data(n: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """The seeds' data set: y = sin(2πx) on [0, 1]."""
    x = torch.linspace(0, 1, n).reshape(-1, 1)
    return x, torch.sin(2 * torch.pi * x)


def small_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def loader(
    x: torch.Tensor, y: torch.Tensor, batch_size: int = 16
) -> torch.utils.data.DataLoader[Any]:
    """Batches in a fixed order, so that both packages see the same batches."""
    dataset = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)


def full_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The mean squared error of ``model`` on all of ``(x, y)``: what the run achieved."""
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


class Counters:
    """Optimizer steps (torch's step hook) and forward passes (a forward hook)."""

    def __init__(self) -> None:
        self.steps = 0
        self.forwards = 0

    def watch_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        def count(*_: Any) -> None:
            self.steps += 1

        optimizer.register_step_post_hook(count)

    def watch_model(self, model: torch.nn.Module) -> None:
        def count(*_: Any) -> None:
            self.forwards += 1

        model.register_forward_hook(count)


def number(value: Any) -> Any:
    """A JSON-friendly copy: tensors and NumPy scalars become floats, containers recurse."""
    if isinstance(value, torch.Tensor):
        return number(value.detach().cpu().tolist())
    if isinstance(value, np.generic):
        return number(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): number(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [number(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return repr(value)


class Masker:
    """Masks run subfolders' names, keeping runs apart.

    The subfolders ``<id>_<timestamp>_<pid>`` of each folder under ``root`` are numbered in
    the order of their time stamps (then ids): the first becomes ``<run0>``, the next
    ``<run1>``. Their ids are kept, in that order, in ``ids``.
    """

    def __init__(self, root: Path) -> None:
        runs = sorted(
            (p for p in root.rglob("*") if p.is_dir() and _SUBFOLDER.fullmatch(p.name)),
            key=lambda p: (str(p.parent), p.name.split("_")[1], int(p.name.split("_")[0])),
        )
        self._index: dict[str, int] = {}
        counts: dict[Path, int] = {}
        for path in runs:
            self._index[str(path.relative_to(root))] = counts.get(path.parent, 0)
            counts[path.parent] = counts.get(path.parent, 0) + 1
        self.ids = [int(p.name.split("_")[0]) for p in runs]

    def __call__(self, relative: str) -> str:
        parts = relative.split("/")
        for i, part in enumerate(parts):
            if _SUBFOLDER.fullmatch(part):
                parts[i] = f"<run{self._index.get('/'.join(parts[: i + 1]), '?')}>"
        relative = _HPARAMS.sub("<time>", "/".join(parts))
        return _EVENTS.sub("events.out.tfevents.<host>", relative)


def files_under(root: Path) -> list[str]:
    mask = Masker(root)
    return sorted(mask(str(p.relative_to(root))) for p in root.rglob("*") if p.is_file())


def checkpoint_epochs(root: Path) -> list[Any]:
    """The epochs (or ``"best"``) of the model checkpoints written under ``root``, in
    perceptrain's names (``model_<Model>_ckpt_<epoch>_device_<device>.pt``)."""
    found: set[Any] = set()
    for path in root.rglob("model_*.pt"):
        match = _CKPT.search(path.name)
        if match:
            number = match[1]
            found.add(number if number == "best" else int(number))
    return sorted(found, key=lambda e: (isinstance(e, str), e if isinstance(e, int) else 0))


def _tensorboard_scalars(folder: Path) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    out: dict[str, Any] = {
        tag: [[e.step, e.value] for e in accumulator.Scalars(tag)] for tag in tags["scalars"]
    }
    for tag in tags.get("images", []):
        out[f"image:{tag}"] = [e.step for e in accumulator.Images(tag)]
    return out


def _csv_scalars(path: Path) -> dict[str, Any]:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return {}
    step_key = next((k for k in ("epoch", "iteration", "step") if k in rows[0]), None)
    out: dict[str, Any] = {}
    for key in rows[0]:
        if key == step_key:
            continue
        series = []
        for row in rows:
            with contextlib.suppress(TypeError, ValueError):
                series.append([int(row[step_key]) if step_key else len(series), float(row[key])])
        if series:
            out[key] = series
    return out


def metrics_written(root: Path) -> dict[str, Any]:
    """Every scalar written under ``root``, by folder then tag: ``[[step, value], ...]``.

    TensorBoard files count for the run folder they belong to: a ``tensorboard/`` folder
    inside a run folder is that run's. Folders whose event files hold no scalar and no image
    (TensorBoard's per-call ``add_hparams`` folders) are left out. CSV files are keyed by
    their own path.
    """
    out: dict[str, Any] = {}
    mask = Masker(root)
    folders = sorted({p.parent for p in root.rglob("events.out.tfevents.*")})
    for folder in folders:
        key = mask(str(folder.relative_to(root)))
        key = key.removesuffix("/tensorboard") if key != "tensorboard" else "."
        try:
            scalars = _tensorboard_scalars(folder)
        except ImportError as exc:
            scalars = {"<unreadable>": str(exc)}
        if scalars:
            out.setdefault(key, {}).update(scalars)
    for path in sorted(root.rglob("*.csv")):
        out[mask(str(path.relative_to(root)))] = _csv_scalars(path)
    return out


def run_folders(files: list[str]) -> list[str]:
    """The run folders among masked file paths: up to a ``<runK>`` part, else the first part
    of the path."""
    found = set()
    for path in files:
        parts = path.split("/")
        runs = [i for i, part in enumerate(parts) if _MASKED_RUN.fullmatch(part)]
        found.add("/".join(parts[: runs[-1] + 1]) if runs else parts[0] if len(parts) > 1 else ".")
    return sorted(found)


def printed_losses(lines: list[str]) -> list[list[Any]]:
    """``[iteration, loss, {metric: value}]`` of every printed line that names an iteration
    and a loss; metric names lower-cased, as in ``Train_Loss: 0.5 - train_mae: 0.6``."""
    found = []
    for line in lines:
        iteration, loss = _ITERATION.search(line), _LOSS.search(line)
        if iteration and loss:
            named = {k.lower(): float(v) for k, v in _NAMED.findall(line)}
            found.append([int(iteration[1]), float(loss[1]), named])
    return found


def _user_lines(text: str) -> list[str]:
    """What was printed, without progress bars and log records rendered into stdout."""
    lines: list[str] = []
    in_record = False
    for line in text.splitlines():
        if _LOG_HEAD.match(line):
            in_record = True
            continue
        if in_record and _LOG_WRAP.match(line):
            continue
        in_record = False
        if line.strip() and not _PROGRESS.search(line):
            lines.append(line.rstrip())
    return lines


class _Records(logging.Handler):
    """Messages logged at INFO or above by the package under test (or the root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        self._seen: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if id(record) not in self._seen:
            self._seen.add(id(record))
            self.messages.append(f"{record.levelname}: {record.getMessage()}")

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        loggers = [logging.getLogger(), logging.getLogger(MODULE.split(".")[0])]
        for logger in loggers:
            logger.addHandler(self)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeHandler(self)


def run(main: Callable[[Counters], dict[str, Any]]) -> None:
    """Run ``main`` in a fresh folder and print what a user sees as one JSON line.

    ``main`` receives the counters to attach to its optimizer and model, and returns the
    script's own observations (merged into the line).
    """
    folder = Path(tempfile.mkdtemp(prefix="perceptrain-compat-"))
    os.chdir(folder)
    torch.set_default_dtype(torch.float64)
    counters = Counters()
    report: dict[str, Any] = {"module": MODULE}
    printed = io.StringIO()
    records = _Records()
    with contextlib.redirect_stdout(printed):
        try:
            api()  # imported first: perceptrain configures its loggers at import
            seed_everything()
            with records.attached():
                report.update(main(counters))
        except Exception as exc:  # what the user sees is the exception
            report["error"] = f"{type(exc).__name__}: {exc}"
            report["traceback"] = traceback.format_exc(limit=-4)
    lines = _user_lines(printed.getvalue())
    report["printed"] = lines
    report["logged"] = records.messages
    report["printed_losses"] = printed_losses(lines)
    report["steps"] = counters.steps
    report["forwards"] = counters.forwards
    report["files"] = files_under(folder)
    report["run_folders"] = run_folders(report["files"])
    report["run_ids"] = Masker(folder).ids
    report["metrics"] = metrics_written(folder)
    report["checkpoints"] = checkpoint_epochs(folder)
    sys.stdout.write(json.dumps(number(report), sort_keys=True) + "\n")
    sys.stdout.flush()


def trainer_state(trainer: Any) -> dict[str, Any]:
    """``current_epoch``, ``global_step`` and ``opt_result`` as a user reads them after fit."""
    missing = "<missing>"
    result = getattr(trainer, "opt_result", None)
    return {
        "current_epoch": getattr(trainer, "current_epoch", missing),
        "global_step": getattr(trainer, "global_step", missing),
        "opt_result": missing
        if result is None
        else {
            "iteration": getattr(result, "iteration", missing),
            "loss": getattr(result, "loss", missing),
            "metrics": sorted(getattr(result, "metrics", {}) or {}),
        },
    }
