"""What may differ between marquardt.trainer and perceptrain 0.1.0, and the comparison of
their two JSON lines that honours it (``test_perceptrain_compat.py`` runs the scripts)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any


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
