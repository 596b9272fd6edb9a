"""How fast this machine is, for the step-time planner: `MachineConstants`.

Three rates, measured once per machine by a few tiny timed kernels (a matrix product, a
Cholesky factorisation, a copy: ``marquardt.jacobian`` times them with torch, since this
package imports neither torch nor NumPy), kept in an in-process table and in a JSON file
of the user's cache folder (``_settings.cache_folder``; never a repository), keyed by the
device, the dtype, the thread count and the library versions. Written atomically (0600,
in a folder created 0700); a corrupt or foreign file is ignored (measured again), never
trusted blindly, and a file or folder another account could have written (``trust``) is
neither read nor written, with one ``UntrustedCacheWarning``. Where nothing
was measured, `DEFAULT_CONSTANTS` (a modest CPU) stand in, and the plan says so.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass

from . import _settings, trust

__all__ = ["DEFAULT_CONSTANTS", "MachineConstants", "load_constants", "store_constants"]

CACHE_FORMAT = "marquardt.machine/1"


@dataclass(frozen=True)
class MachineConstants:
    """The rates the step-time model divides work by.

    Arguments:
        matmul_flops: flop/s of a matrix product in the model's dtype (forward and reverse
            passes, Gram products and Jacobian-vector products are made of them).
        factor_flops: flop/s of a float64 Cholesky factorisation.
        bandwidth: bytes/s of a large copy (memory traffic: writing J, reading JᵀJ).
        source: where the figures come from ("measured", "cached", "default", "injected").
    """

    matmul_flops: float
    factor_flops: float
    bandwidth: float
    source: str = "injected"

    def __post_init__(self) -> None:
        for name in ("matmul_flops", "factor_flops", "bandwidth"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(
                    f"MachineConstants({name}={value!r}) was given; rates are positive finite "
                    "numbers per second. HINT: pass e.g. matmul_flops=5e10"
                )


#: A modest CPU core pair: used where nothing was measured.
DEFAULT_CONSTANTS = MachineConstants(
    matmul_flops=2e10, factor_flops=5e9, bandwidth=5e9, source="default"
)

_MEMORY: dict[str, MachineConstants] = {}


def _path() -> str:
    return os.path.join(_settings.cache_folder(), "machine.json")


def _trusted(path: str) -> bool:
    """Whether ``path`` and the cache root above it pass ``trust.check`` (else one warning)."""
    verdict = trust.check(_settings.cache_folder(), path)
    if not verdict.trusted:
        trust.warn_untrusted(verdict, "the machine's measured rates", "MARQUARDT_CACHE_DIR", 4)
    return verdict.trusted


def load_constants(key: str) -> MachineConstants | None:
    """The constants measured under ``key``: in this process, else in the cache file.

    Arguments:
        key: the measurement's key (device, dtype, threads, versions).

    Returns:
        The constants; None when never measured, or the file is unreadable or of another
        format (then they are measured again).
    """
    if key in _MEMORY:
        return _MEMORY[key]
    if not _trusted(_path()):
        return None
    try:
        with open(_path(), encoding="utf-8") as fh:
            table = json.load(fh)
        if table.get("format") != CACHE_FORMAT:
            return None
        found = MachineConstants(**{**table["machines"][key], "source": "cached"})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    _MEMORY[key] = found
    return found


def store_constants(key: str, constants: MachineConstants) -> None:
    """Keep ``constants`` under ``key`` in this process and, atomically, in the cache file
    (a folder that cannot be written is skipped: the in-process table still holds them).

    Arguments:
        key: the measurement's key.
        constants: the measured rates.
    """
    _MEMORY[key] = constants
    path = _path()
    if not _trusted(path):
        return
    try:
        with open(path, encoding="utf-8") as fh:
            table = json.load(fh)
        if not isinstance(table, dict) or table.get("format") != CACHE_FORMAT:
            raise ValueError
    except (OSError, ValueError):
        table = {"format": CACHE_FORMAT, "machines": {}}
    entry = {k: v for k, v in asdict(constants).items() if k != "source"}
    table.setdefault("machines", {})[key] = entry
    try:
        trust.make_private(_settings.cache_folder(), os.path.dirname(path))
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(table, fh)
        os.replace(tmp, path)
    except OSError:
        return
