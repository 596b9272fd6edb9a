"""Every public function and class of marquardt.devices lists its arguments and its result
(the check: ``marquardt.testing.docstrings``)."""

from __future__ import annotations

import marquardt.devices as package
from marquardt.testing.docstrings import package_problems


def test_every_public_function_and_class_lists_its_arguments_and_result() -> None:
    assert package_problems(package) == []
