"""Shared test set-up for marquardt.solver.

The tests folder itself is put on ``sys.path`` so that test modules can import their
helpers (``problems``, ``legate_support``) under ``--import-mode=importlib``, which does
not add test folders to the path. Compiled kernels go to a temporary folder of the
session (``MARQUARDT_CACHE_DIR``, whose ``compiled`` folder holds them), never to the
user's cache folder. Background kernel builds are off for the session
(``MARQUARDT_SOLVER_BACKGROUND_BUILD=0``: a call under ``compile="auto"`` would otherwise
start a compile of its model in another process); the tests of those builds turn them on,
and any build a test left running is ended with the session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from marquardt.solver._curve.kernel_cache import background

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's folder of compiled kernels (the user's is left alone)."""
    folder = tmp_path_factory.mktemp("marquardt-cache")
    names = ("MARQUARDT_CACHE_DIR", "MARQUARDT_SOLVER_BACKGROUND_BUILD")
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(dict(zip(names, (str(folder), "0"), strict=True)))
    yield folder
    background.cancel()
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
