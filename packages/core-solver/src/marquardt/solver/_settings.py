"""Every environment variable ``marquardt.solver`` reads, with its meaning.

``MARQUARDT_SOLVER_BACKEND``
    Overrides what ``LMA(backend="auto")`` picks: one of ``numpy``, ``torch``,
    ``cupynumeric``. Unset (the default): cuPyNumeric when Legate holds at least one GPU,
    else torch on the model's device. An explicit ``backend=`` argument is never overridden.

``MARQUARDT_SOLVER_CHECK_RANKS``
    ``1`` (or ``true``/``yes``): an ``LMA`` built with a ``process_group`` compares λ, the
    attempts, the acceptance, the step norm, the loss and Σθ across ranks after every step
    (one all-gather of six numbers) and raises ``RanksDisagreeError`` naming the ranks that
    differ. Unset or ``0`` (the default): no check. Read when the ``LMA`` is built.

``MARQUARDT_SOLVER_BACKGROUND_BUILD``
    ``0`` (or ``false``/``no``/``off``): under ``compile="auto"`` a missing kernel is never
    built in a background process (the call runs eagerly and nothing is built; for batch
    jobs that must not leave a process behind). Unset or ``1`` (the default): it is built
    in the background (``_curve.kernel_cache.background``). Read at each call.

Nothing else is read here. Which GPUs Legate holds, and where the user's cache folder is
(``MARQUARDT_CACHE_DIR``, read by ``marquardt.devices.cache_folder()``; the solver keeps
its compiled kernels in its ``compiled`` folder, never inside a git work tree), are
answered by ``marquardt.devices`` (see ``marquardt.devices._settings``); Legate's own
variables (``LEGATE_CONFIG``, ``CUPYNUMERIC_*``) are read by Legate. Values are read when asked for, never at import.
"""

from __future__ import annotations

import os
from pathlib import Path

from marquardt.devices import cache_folder

__all__ = [
    "BACKEND_NAMES",
    "CACHE_DIR_ENV",
    "backend_override",
    "background_build",
    "cache_dir",
    "cache_root",
    "check_ranks",
]

#: The variable that moves the cache folder (read by ``marquardt.devices.cache_folder``).
CACHE_DIR_ENV = "MARQUARDT_CACHE_DIR"

#: Names accepted for ``MARQUARDT_SOLVER_BACKEND`` and ``LMA(backend=...)`` (plus ``auto``).
BACKEND_NAMES: tuple[str, ...] = ("numpy", "torch", "cupynumeric")


def backend_override() -> str | None:
    """The backend named by ``MARQUARDT_SOLVER_BACKEND``, or ``None`` when unset or empty.

    Raises ``ValueError`` (house form) for a name that is not a backend.
    """
    value = os.environ.get("MARQUARDT_SOLVER_BACKEND", "").strip().lower()
    if not value:
        return None
    if value not in BACKEND_NAMES:
        raise ValueError(
            f"MARQUARDT_SOLVER_BACKEND={value!r} is not a backend; expected one of "
            f"{BACKEND_NAMES}. HINT: unset it to let LMA(backend='auto') choose."
        )
    return value


def background_build() -> bool:
    """Whether ``MARQUARDT_SOLVER_BACKGROUND_BUILD`` allows background kernel builds.

    Returns:
        False for ``0``, ``false``, ``no`` or ``off``; True otherwise (unset included).
    """
    value = os.environ.get("MARQUARDT_SOLVER_BACKGROUND_BUILD", "").strip().lower()
    return value not in ("0", "false", "no", "off")


def check_ranks() -> bool:
    """Whether ``MARQUARDT_SOLVER_CHECK_RANKS`` asks for the after-step agreement check."""
    value = os.environ.get("MARQUARDT_SOLVER_CHECK_RANKS", "").strip().lower()
    return value in ("1", "true", "yes", "on")


def cache_root() -> Path:
    """The folder every package of marquardt caches in (not created here).

    Returns:
        ``marquardt.devices.cache_folder()``: ``MARQUARDT_CACHE_DIR``, else ``marquardt`` in
        the platform's cache folder.
    """
    return Path(cache_folder())


def cache_dir() -> Path:
    """The folder of compiled kernels (not created here).

    Returns:
        ``compiled`` in ``cache_root()``.
    """
    return cache_root() / "compiled"
