"""Shared test set-up for marquardt.solver.

The tests folder itself is put on ``sys.path`` so that test modules can import their
helpers (``problems``, ``legate_support``) under ``--import-mode=importlib``, which does
not add test folders to the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
