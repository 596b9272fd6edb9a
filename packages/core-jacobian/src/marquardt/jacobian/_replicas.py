"""Model replicas bound to one flat parameter vector per device.

The Levenberg-Marquardt step (Marquardt 1963) updates all trainable parameters at once,
``θ ← θ − lr·δ``, with ``δ`` a vector of length ``P``. Each replica therefore keeps its
trainable parameters (``requires_grad=True``; frozen ones are left alone) as views into
one contiguous vector ``θ_d`` on its device ``d``, so a step, a backup and a restore are
single vector operations. The source model is the replica on its own device; the other
devices get deep copies, buffers included (a device may appear several times: each
entry is its own replica, so several CPU "devices" compute concurrently).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ._errors import (
    DeviceMismatchError,
    NoTrainableParametersError,
    ParameterDtypeError,
    message,
)

__all__ = ["Replica", "Replicas"]


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` name the same device when the current device is 0."""
    if a.type != b.type:
        return False
    if a.type == "cpu":
        return True
    ia = a.index if a.index is not None else 0
    ib = b.index if b.index is not None else 0
    return ia == ib


@dataclass
class Replica:
    """One copy of the model on one device, its parameters bound to ``flat``."""

    module: nn.Module
    device: torch.device
    flat: torch.Tensor
    names: list[str]
    shapes: list[torch.Size]
    sizes: list[int]
    params: list[nn.Parameter]
    backup: torch.Tensor | None = field(default=None)

    def param_dict(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Names to views of ``flat`` shaped as the trainable parameters."""
        chunks = torch.split(flat, self.sizes)
        return {n: c.view(s) for n, c, s in zip(self.names, chunks, self.shapes, strict=True)}


def _trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _bind(module: nn.Module, device: torch.device) -> Replica:
    """Copy the trainable parameters into one vector and make them views of it."""
    named = _trainable(module)
    names = [n for n, _ in named]
    params = [p for _, p in named]
    shapes = [p.shape for p in params]
    sizes = [p.numel() for p in params]
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params]).to(device)
        offset = 0
        for p, size, shape in zip(params, sizes, shapes, strict=True):
            # Rebinding .data keeps the Parameter objects (and any reference to them)
            # while their storage becomes a slice of the flat vector.
            p.data = flat[offset : offset + size].view(shape)
            offset += size
    return Replica(module, device, flat, names, shapes, sizes, params)


class Replicas:
    """The model replicated on ``devices``, trainable parameters bound to flat vectors.

    ``θ`` (``P`` trainable parameters, frozen ones excluded) lives once per replica as a
    contiguous vector; ``add_(δ, α)`` performs ``θ ← θ + α·δ`` on every replica,
    ``backup()``/``restore()`` keep and bring back one copy of ``θ`` per replica.

    Arguments:
        model: the model; it stays the replica on its own device, which must be one of
            ``devices``, and the others are deep copies of it.
        devices: the model devices, one replica each.

    Raises:
        DeviceMismatchError: ``devices`` is empty, the model's parameters and buffers are
            on several devices, or the model's device is not among ``devices``.
        NoTrainableParametersError: the model has no trainable parameter.
        ParameterDtypeError: the trainable parameters are not all of one floating dtype.
    """

    def __init__(self, model: nn.Module, devices: Sequence[torch.device | str]) -> None:
        devs = [torch.device(d) for d in devices]
        if not devs:
            raise DeviceMismatchError(
                message(
                    "replicas were requested on a list of model devices",
                    "the list is empty",
                    "pass at least one device, e.g. [torch.device('cpu')] or "
                    "marquardt.devices.get_available_gpus()",
                )
            )
        named = _trainable(model)
        if not named:
            total = sum(1 for _ in model.parameters())
            raise NoTrainableParametersError(
                message(
                    f"a Jacobian was requested for {type(model).__name__}",
                    f"it has no trainable parameter ({total} parameters, all with "
                    "requires_grad=False)",
                    "unfreeze at least one parameter (p.requires_grad_(True))",
                )
            )
        dtypes = {p.dtype for _, p in named}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise ParameterDtypeError(
                message(
                    "the trainable parameters were to be bound to one flat vector",
                    f"they have dtypes {sorted(str(d) for d in dtypes)}",
                    "cast the model to one floating dtype, e.g. model.double()",
                )
            )
        model_devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
        if len(model_devices) != 1:
            raise DeviceMismatchError(
                message(
                    f"replicas of {type(model).__name__} were requested on {devs}",
                    f"its parameters and buffers are spread over {sorted(map(str, model_devices))}",
                    "move the whole model to one of the devices with model.to(devices[0])",
                )
            )
        home = next(iter(model_devices))
        matches = [i for i, d in enumerate(devs) if _same_device(d, home)]
        if not matches:
            raise DeviceMismatchError(
                message(
                    f"replicas were requested on devices {[str(d) for d in devs]}",
                    f"the model is on {home}, which is not one of them",
                    f"move the model with model.to({str(devs[0])!r}) or add {str(home)!r} "
                    "to devices",
                )
            )
        self._devices = devs
        self._model = model
        source_index = matches[0]
        replicas: list[Replica] = []
        for i, dev in enumerate(devs):
            if i == source_index:
                replicas.append(_bind(model, home))
            else:
                # Copy the model as it stands (before rebinding would not matter: the
                # values are the same) and move the copy, buffers included.
                replicas.append(_bind(copy.deepcopy(model).to(dev), dev))
        self._replicas = replicas
        self._source_index = source_index

    # -- description -------------------------------------------------------------------
    @property
    def devices(self) -> list[torch.device]:
        """The model devices, one replica each, in the order given."""
        return list(self._devices)

    @property
    def model(self) -> nn.Module:
        """The source model (the replica on its own device)."""
        return self._model

    @property
    def num_params(self) -> int:
        """``P``, the number of trainable parameters."""
        return int(self._replicas[0].flat.numel())

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the trainable parameters."""
        return self._replicas[0].flat.dtype

    @property
    def names(self) -> list[str]:
        """Names of the trainable parameters, in the order of the flat vector."""
        return list(self._replicas[0].names)

    def __len__(self) -> int:
        return len(self._replicas)

    def __getitem__(self, index: int) -> Replica:
        return self._replicas[index]

    # -- the flat vector ---------------------------------------------------------------
    def flat_params(self) -> torch.Tensor:
        """A copy of ``θ`` on ``devices[0]``."""
        return self._replicas[0].flat.detach().clone()

    def _check_vector(self, vector: torch.Tensor, what: str) -> None:
        if vector.dim() != 1 or vector.numel() != self.num_params:
            raise ValueError(
                message(
                    f"{what} expects a vector of the {self.num_params} trainable parameters",
                    f"it got a tensor of shape {tuple(vector.shape)}",
                    "flatten it in the order of Replicas.names (torch.cat of p.reshape(-1))",
                )
            )
        if not bool(torch.isfinite(vector).all()):
            raise ValueError(
                message(
                    f"{what} expects a finite parameter vector",
                    "it contains NaN or infinity",
                    "check the step that produced it; no replica was changed",
                )
            )

    @torch.no_grad()
    def set_flat_params(self, flat: torch.Tensor) -> None:
        """``θ ← flat`` on every replica."""
        self._check_vector(flat, "set_flat_params")
        for r in self._replicas:
            r.flat.copy_(flat.to(device=r.device, dtype=r.flat.dtype), non_blocking=False)

    @torch.no_grad()
    def add_(self, delta: torch.Tensor, alpha: float = 1.0, *, check: bool = True) -> None:
        """``θ ← θ + α·δ`` on every replica (``δ`` on any device, any floating dtype).

        δ goes from its device to each replica's directly. ``check=False`` skips the scan
        for NaN/inf (a host synchronisation on a GPU), for a caller that evaluates the
        point and restores a ``backup()`` when it is not finite; the shape is always checked.
        """
        if check or delta.dim() != 1 or delta.numel() != self.num_params:
            self._check_vector(delta, "add_")
        for r in self._replicas:
            r.flat.add_(delta.to(device=r.device, dtype=r.flat.dtype), alpha=alpha)

    @torch.no_grad()
    def backup(self) -> None:
        """Keep a copy of ``θ`` on every replica (one per replica, overwritten each call)."""
        for r in self._replicas:
            if r.backup is None:
                r.backup = r.flat.detach().clone()
            else:
                r.backup.copy_(r.flat)

    @torch.no_grad()
    def restore(self) -> None:
        """``θ ← backup`` on every replica.

        Callers restore while a Ctrl-C is already on its way (in ``finally``): a second
        interrupt landing here does not stop half-way, leaving some replicas at the trial
        point; every replica is restored, then the interrupt is raised.
        """
        if any(r.backup is None for r in self._replicas):
            raise RuntimeError(
                message(
                    "restore() was asked to bring back the parameters",
                    "no backup() was taken before",
                    "call backup() before the trial step",
                )
            )
        interrupt: BaseException | None = None
        pending = list(self._replicas)
        while pending:
            try:
                while pending:
                    r = pending[0]
                    assert r.backup is not None
                    r.flat.copy_(r.backup)
                    pending.pop(0)
            except (KeyboardInterrupt, SystemExit) as exc:
                interrupt = interrupt or exc
        if interrupt is not None:
            raise interrupt

    @torch.no_grad()
    def sync_from_model(self) -> None:
        """Copy the source model's ``θ`` and buffers to every other replica.

        For after the source model was written directly (``load_state_dict``): its
        parameters are views of its own replica's flat vector only.
        """
        if len(self._replicas) < 2:
            return
        self.set_flat_params(self._replicas[self._source_index].flat.detach().clone())
        self.sync_buffers()

    @torch.no_grad()
    def sync_buffers(self) -> None:
        """Copy the source model's buffers (e.g. running statistics) to every copy."""
        source = dict(self._model.named_buffers())
        for i, r in enumerate(self._replicas):
            if i == self._source_index:
                continue
            for name, buf in r.module.named_buffers():
                buf.copy_(source[name].to(buf.device))
