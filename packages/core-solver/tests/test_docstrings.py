"""Every public function and class of marquardt.solver lists its arguments and its result.

The check itself is the repository's ``tools/docstring_lists.py`` (one home for the
packages that run it), loaded from its file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import marquardt.solver as package


def _docstring_lists() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "tools" / "docstring_lists.py"
    spec = importlib.util.spec_from_file_location("docstring_lists", path)
    assert spec is not None and spec.loader is not None, f"no checker at {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_function_and_class_lists_its_arguments_and_result() -> None:
    assert _docstring_lists().package_problems(package) == []
