"""Which array backend ``LMA(backend=...)`` gets.

``auto`` follows the deployment rule of the design: when Legate holds at least one GPU the
normal equations go to cuPyNumeric (J or JᵀJ distributed over Legate's GPUs); otherwise
everything stays on the model's device with the torch backend (no transfer at all). The
``MARQUARDT_SOLVER_BACKEND`` variable (see ``_settings``) overrides ``auto``. Backends are
imported only when chosen, so cuPyNumeric (and Legate's runtime) is never loaded unless
asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from marquardt.devices import legate_gpu_count

from .. import _settings
from .._errors import BackendUnavailableError, SolverConfigError
from .base import ArrayBackend

__all__ = ["BACKEND_CHOICES", "legate_gpus", "resolve_backend"]

#: What ``LMA(backend=...)`` accepts as a name.
BACKEND_CHOICES: tuple[str, ...] = ("auto", *_settings.BACKEND_NAMES)

_MODULES = {
    "numpy": "marquardt.solver._backends.numpy_backend",
    "torch": "marquardt.solver._backends.torch_backend",
    "cupynumeric": "marquardt.solver._backends.cupynumeric_backend",
}


def legate_gpus() -> int:
    """How many GPUs Legate holds, from ``marquardt.devices.legate_gpu_count`` (0 when it
    cannot tell). Never starts Legate."""
    try:
        return int(legate_gpu_count())
    except Exception:  # a malformed LEGATE_CONFIG must not stop a CPU run from choosing
        return 0


def _auto_name() -> str:
    override = _settings.backend_override()
    if override is not None:
        return override
    return "cupynumeric" if legate_gpus() >= 1 else "torch"


def resolve_backend(backend: str | ArrayBackend, device: torch.device) -> ArrayBackend:
    """The backend object for ``backend`` (a name or an instance) on model device ``device``."""
    if not isinstance(backend, str):
        if isinstance(backend, ArrayBackend):
            return backend
        raise SolverConfigError(
            f"LMA(backend=...) expects a name in {BACKEND_CHOICES} or an ArrayBackend, "
            f"got {type(backend).__name__}. HINT: pass backend='auto'."
        )
    name = backend.strip().lower()
    if name not in BACKEND_CHOICES:
        raise SolverConfigError(
            f"LMA(backend={backend!r}) is not a backend; expected one of {BACKEND_CHOICES}. "
            "HINT: 'auto' picks cupynumeric under Legate with GPUs, else torch."
        )
    if name == "auto":
        name = _auto_name()
    try:
        module: Any = importlib.import_module(_MODULES[name])
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {name!r} was requested but cannot be imported ({exc}). HINT: "
            + (
                "install the extra with pip install 'marquardt-solver[legate]' and run "
                "under `legate`, or use backend='torch'."
                if name == "cupynumeric"
                else "reinstall marquardt-solver."
            )
        ) from exc
    factory = getattr(module, "create_backend", None)
    if factory is None:
        raise BackendUnavailableError(
            f"backend module {_MODULES[name]} has no create_backend(device) factory. "
            "HINT: every backend module must define it (see _backends/base.py)."
        )
    created = factory(device)
    if not isinstance(created, ArrayBackend):
        raise BackendUnavailableError(
            f"{_MODULES[name]}.create_backend returned {type(created).__name__}, which is not "
            "an ArrayBackend. HINT: implement the protocol in _backends/base.py."
        )
    return created
