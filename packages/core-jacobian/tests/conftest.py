"""Shared test set-up for marquardt.jacobian.

The tests folder is put on ``sys.path`` so test modules can import ``jacobian_problems``
under ``--import-mode=importlib``, which does not add test folders to the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from jacobian_problems import PROBLEMS, Problem, make_problem  # noqa: E402


@pytest.fixture(params=PROBLEMS)
def problem(request: pytest.FixtureRequest) -> Problem:
    """Each shared problem in turn."""
    return make_problem(request.param)
