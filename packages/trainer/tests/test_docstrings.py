"""Every public function and class of marquardt.trainer lists its arguments and its result
(the check: ``marquardt.testing.docstrings``)."""

from __future__ import annotations

import marquardt.trainer as package
from marquardt.testing.docstrings import package_problems, problems
from marquardt.trainer.optimize_step import optimize_step


def test_every_public_function_and_class_lists_its_arguments_and_result() -> None:
    assert package_problems(package) == []


def test_optimize_step_lists_its_arguments_and_result() -> None:
    # Public through its own module (perceptrain's import path), and in the API reference.
    assert problems("optimize_step", optimize_step) == []
