"""perceptrain's checkpoint helpers: ``write_checkpoint``, ``load_checkpoint``, ``load_model``.

They write and read perceptrain's file names in a folder,
``model_<Model>_ckpt_<iteration>_device_<device>.pt`` holding ``(iteration, state_dict)``
and ``opt_<Optimizer>_ckpt_<iteration>_device_<device>.pt`` holding ``(iteration, class
name, state_dict)``, written atomically and read with ``torch.load(weights_only=True)``
(perceptrain pickles the optimizer class; a name is enough to check it). Reading a run
folder of this trainer (``checkpoints/ckpt_<step>.pt``) works too: the newest checkpoint's
model and optimizer states and its epoch. The trainer's own resume is
``TrainConfig.resume_from``; these (and the ``LoadCheckpoint`` callback) are for a user's
scripts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._callbacks._base import Callback
from . import _files as ckpt

_INDEXED = re.compile(r"_ckpt_(\d+)_device_[^.]*\.pt$")


def _device_name(model: nn.Module) -> str:
    try:
        return next(model.parameters()).device.type
    except StopIteration:
        return "cpu"


def _label(iteration: int | str) -> str:
    return f"{iteration:03d}" if isinstance(iteration, int) else str(iteration)


def write_checkpoint(
    folder: str | Path, model: nn.Module, optimizer: Any, iteration: int | str
) -> None:
    """Write the model's and the optimizer's states at ``iteration`` (an epoch, or ``"best"``)."""
    folder = Path(folder)
    device = _device_name(model)
    label = _label(iteration)
    ckpt.atomic_save(
        (iteration, ckpt.bare_state_dict(model)),
        folder / f"model_{type(model).__name__}_ckpt_{label}_device_{device}.pt",
    )
    if optimizer is not None and hasattr(optimizer, "state_dict"):
        ckpt.atomic_save(
            (iteration, type(optimizer).__name__, optimizer.state_dict()),
            folder / f"opt_{type(optimizer).__name__}_ckpt_{label}_device_{device}.pt",
        )


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
    """Load the newest (or the named) model state of ``folder``; ``(model, iteration)``.

    Nothing to load leaves the model as it is and returns iteration 0 (perceptrain's way).
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

    Returns ``(model, optimizer, iteration)``; a folder that does not exist is created and
    nothing is loaded (iteration 0), as perceptrain does.
    """
    folder = Path(folder)
    if not folder.exists():
        folder.mkdir(parents=True)
        return model, optimizer, 0
    model, iteration = load_model(folder, model, model_ckpt_name, device)
    path = folder / opt_ckpt_name if opt_ckpt_name else _latest(folder, "opt")
    if path is not None and path.is_file():
        _, name, state = torch.load(path, map_location="cpu", weights_only=True)
        if name == type(optimizer).__name__:
            optimizer.load_state_dict(state)
        return model, optimizer, iteration
    data = _own_checkpoint(folder)
    same_class = data is not None and data.get("optimizer_class") == type(optimizer).__name__
    if same_class and data is not None and data.get("optimizer") is not None:
        optimizer.load_state_dict(data["optimizer"])
    return model, optimizer, iteration


class LoadCheckpoint(Callback):
    """Load the newest checkpoint of ``config.log_folder`` into the model and optimizer.

    Returns ``(model, optimizer, epoch)`` as perceptrain's does. The trainer itself resumes
    through ``TrainConfig.resume_from``; this is for a user's own use.
    """

    def run_callback(self, trainer: Any, config: Any, writer: Any) -> Any:
        return load_checkpoint(config.log_folder, trainer.model, trainer.optimizer)
