"""Shared test set-up for marquardt.solver.

The tests folder itself is put on ``sys.path`` so that test modules can import their
helpers (``problems``, ``legate_support``) under ``--import-mode=importlib``, which does
not add test folders to the path. Compiled kernels go to a temporary folder of the
session (``MARQUARDT_CACHE_DIR``, whose ``compiled`` folder holds them), never to the
user's cache folder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture(autouse=True, scope="session")
def _kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's folder of compiled kernels (the user's is left alone)."""
    folder = tmp_path_factory.mktemp("marquardt-cache")
    before = os.environ.get("MARQUARDT_CACHE_DIR")
    os.environ["MARQUARDT_CACHE_DIR"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("MARQUARDT_CACHE_DIR", None)
    else:
        os.environ["MARQUARDT_CACHE_DIR"] = before
