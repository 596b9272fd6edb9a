"""perceptrain's checkpoint files: ``write_checkpoint``, ``load_checkpoint``, ``load_model``.

perceptrain's file names in a folder: ``model_<Model>_ckpt_<iteration>_device_<device>.pt``
holding ``(iteration, state_dict)`` and ``opt_<Optimizer>_ckpt_<iteration>_device_<device>.pt``
holding ``(iteration, optimizer class, state_dict)``, the iteration zero-padded to three
digits, or ``best``. The trainer writes this pair into the run folder at every checkpoint
(``_run_state``), so files written here load in perceptrain and perceptrain's load here.
Writes are atomic (a temporary file renamed over the name); reads use
``torch.load(weights_only=True)``, with the optimizer's own class as the only class the file
may name (another class: the optimizer is left as it is, as perceptrain leaves it). Reading
a run folder of this trainer that holds only ``checkpoints/ckpt_<step>.pt`` works too: the
newest checkpoint's model and optimizer states and its epoch. The trainer's own resume is
``TrainConfig.resume_from``; these (and the ``LoadCheckpoint`` callback) are for a user's
scripts.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._callbacks._base import OWN_WORK_LISTS, Callback
from .._doclists import with_lists
from .._errors import CheckpointCorruptError
from . import _files as ckpt

_INDEXED = re.compile(r"_ckpt_(\d+)_device_[^.]*\.pt$")


def _device_name(model: nn.Module) -> str:
    try:
        return next(model.parameters()).device.type
    except StopIteration:
        return "cpu"


def _label(iteration: int | str) -> str:
    return f"{iteration:03d}" if isinstance(iteration, int) else str(iteration)


def _bare(model: nn.Module) -> nn.Module:
    """The model inside DDP (or DataParallel): its class names the files."""
    while isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
        model = model.module
    return model


def checkpoint_names(model: nn.Module, optimizer: Any, iteration: int | str) -> tuple[str, str]:
    """perceptrain's names of the model and optimizer files at ``iteration``."""
    model = _bare(model)
    suffix = f"_ckpt_{_label(iteration)}_device_{_device_name(model)}.pt"
    return (
        f"model_{type(model).__name__}{suffix}",
        f"opt_{type(optimizer).__name__}{suffix}",
    )


def write_checkpoint(
    folder: str | Path, model: nn.Module, optimizer: Any, iteration: int | str
) -> None:
    """Write the model's and the optimizer's states at ``iteration`` (an epoch, or ``"best"``).

    Arguments:
        folder: where the files go (created if missing).
        model: the model (inside DDP: the model it wraps names the file).
        optimizer: a torch optimizer, or any object with ``state_dict``; ``None``: the model
            alone.
        iteration: the epoch, or ``"best"``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model_name, optimizer_name = checkpoint_names(model, optimizer, iteration)
    ckpt.atomic_save((iteration, ckpt.bare_state_dict(model)), folder / model_name)
    if optimizer is not None and hasattr(optimizer, "state_dict"):
        # the class itself, as perceptrain stores it (its loader checks isinstance)
        ckpt.atomic_save(
            (iteration, type(optimizer), optimizer.state_dict()), folder / optimizer_name
        )


def _read_optimizer_file(path: Path, optimizer: Any) -> tuple[Any, Any] | None:
    """``(stored class or name, state)`` of an optimizer file; None when it names a class
    other than ``optimizer``'s (``torch.load(weights_only=True)`` refuses to import it)."""
    try:
        with torch.serialization.safe_globals([type(optimizer)]):
            _, stored, state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" in str(exc).lower():
            return None
        raise CheckpointCorruptError(
            f"optimizer checkpoint {path} cannot be read ({str(exc).splitlines()[0][:200]}). "
            "HINT: name another file with opt_ckpt_name=..., or load the model alone with "
            "load_model"
        ) from None
    return stored, state


def _latest(folder: Path, prefix: str) -> Path | None:
    """The file of ``prefix`` with the highest iteration (or the only one)."""
    files = [p for p in folder.glob(f"{prefix}_*.pt") if p.is_file()]
    if len(files) == 1:
        return files[0]
    indexed = [(int(m.group(1)), p) for p in files if (m := _INDEXED.search(p.name))]
    return max(indexed)[1] if indexed else None


def _own_checkpoint(folder: Path) -> dict[str, Any] | None:
    """The newest checkpoint of a run folder of this trainer, if ``folder`` is one."""
    found = ckpt.list_checkpoints(folder / ckpt.CHECKPOINT_DIR) or ckpt.list_checkpoints(folder)
    return ckpt.read_checkpoint(found[-1][1]) if found else None


def load_model(
    folder: str | Path,
    model: nn.Module,
    model_ckpt_name: str | Path = "",
    device: str | torch.device = "cpu",
) -> tuple[nn.Module, int]:
    """Load the newest (or the named) model state of ``folder``.

    Arguments:
        folder: a folder of perceptrain's files, or a run folder of this trainer.
        model: the model whose state is loaded, in place.
        model_ckpt_name: the file to load, in ``folder``; ``""``: the newest.
        device: where the model is moved after loading.

    Returns:
        ``(model, iteration)``. Nothing to load leaves the model as it is and returns
        iteration 0 (perceptrain's way).

    Raises:
        CheckpointCorruptError: the newest checkpoint of a run folder of this trainer
            cannot be read.
    """
    folder = Path(folder)
    path = folder / model_ckpt_name if model_ckpt_name else _latest(folder, "model")
    if path is not None and path.is_file():
        iteration, state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt.strip_prefixes(state))
        return model.to(device), int(iteration) if isinstance(iteration, int) else 0
    data = _own_checkpoint(folder)
    if data is None:
        return model, 0
    model.load_state_dict(ckpt.strip_prefixes(data["model"]))
    return model.to(device), int(data.get("current_epoch", data["epoch"]))


def load_checkpoint(
    folder: str | Path,
    model: nn.Module,
    optimizer: Any,
    model_ckpt_name: str | Path = "",
    opt_ckpt_name: str | Path = "",
    device: str | torch.device = "cpu",
) -> tuple[nn.Module, Any, int]:
    """Load the newest (or the named) model and optimizer states of ``folder``.

    The optimizer's state is loaded only from a file that names the optimizer's own class;
    otherwise the optimizer is left as it is, as perceptrain leaves it.

    Arguments:
        folder: a folder of perceptrain's files, or a run folder of this trainer.
        model: the model whose state is loaded, in place.
        optimizer: the optimizer whose state is loaded, in place.
        model_ckpt_name: the model file to load, in ``folder``; ``""``: the newest.
        opt_ckpt_name: the optimizer file to load, in ``folder``; ``""``: the newest.
        device: where the model is moved after loading.

    Returns:
        ``(model, optimizer, iteration)``; a folder that does not exist is created and
        nothing is loaded (iteration 0), as perceptrain does.

    Raises:
        CheckpointCorruptError: the optimizer file, or the newest checkpoint of a run
            folder of this trainer, cannot be read.
    """
    folder = Path(folder)
    if not folder.exists():
        folder.mkdir(parents=True)
        return model, optimizer, 0
    model, iteration = load_model(folder, model, model_ckpt_name, device)
    path = folder / opt_ckpt_name if opt_ckpt_name else _latest(folder, "opt")
    if path is not None and path.is_file():
        read = _read_optimizer_file(path, optimizer)
        if read is not None:
            stored, state = read
            same = stored is type(optimizer) or stored == type(optimizer).__name__
            if same:
                optimizer.load_state_dict(state)
        return model, optimizer, iteration
    data = _own_checkpoint(folder)
    same_class = data is not None and data.get("optimizer_class") == type(optimizer).__name__
    if same_class and data is not None and data.get("optimizer") is not None:
        optimizer.load_state_dict(data["optimizer"])
    return model, optimizer, iteration


class FolderCheckpoints:
    """A trainer's checkpoints outside ``fit`` (``SaveCheckpoint`` or ``SaveBestCheckpoint``
    called by hand): perceptrain's pair of its model and optimizer in ``config.log_folder``,
    at ``opt_result.iteration`` (or ``"best"``)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def save(self) -> None:
        trainer = self.trainer
        result = trainer.opt_result
        iteration = result.iteration if result is not None else trainer.current_epoch
        write_checkpoint(trainer.config.log_folder, trainer.model, trainer.optimizer, iteration)

    def save_best(self) -> None:
        trainer = self.trainer
        write_checkpoint(trainer.config.log_folder, trainer.model, trainer.optimizer, "best")


@with_lists(OWN_WORK_LISTS)
class LoadCheckpoint(Callback):
    """Load the newest checkpoint of ``config.log_folder`` into the model and optimizer.

    Its ``run_callback`` returns ``(model, optimizer, epoch)`` as perceptrain's does. The
    trainer itself resumes through ``TrainConfig.resume_from``; this is for a user's own
    use.
    """

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        return load_checkpoint(config.log_folder, trainer.model, trainer.optimizer)
