"""``marquardt.testing.docstrings``, which each package's ``tests/test_docstrings.py`` runs:
what it reports on small examples, so a package test that passes means the lists are there."""

from __future__ import annotations

import dataclasses
import enum
import types
from typing import Protocol

import marquardt.testing.docstrings as lists


def complete(a: int, *rest: int, b: str = "") -> int:
    """Add.

    Arguments:
        a: first.
        *rest: the others.
        b (str): a label.

    Returns:
        The sum.
    """
    return a + sum(rest)


def missing_entry(a: int, b: int) -> None:
    """Nothing.

    Arguments:
        a: first.
    """


def extra_entry(a: int) -> None:
    """Nothing.

    Arguments:
        a: first.
        gone: a parameter that was removed.
    """


def no_returns(a: int) -> int:
    """Twice.

    Arguments:
        a: the number.
    """
    return 2 * a


def unannotated_return(a):  # no annotations: the body says whether it returns a value
    """Twice.

    Arguments:
        a: the number.
    """
    if a:
        return 2 * a
    return None


def unannotated_without_value(a):
    """Print.

    Arguments:
        a: the number.
    """

    def inner() -> int:
        return a

    print(inner())


def no_arguments() -> None:
    """Nothing to list."""


@dataclasses.dataclass
class Fields:
    """A value.

    Arguments:
        x: one field.
    """

    x: int
    y: int = 0
    z: int = dataclasses.field(default=0, init=False)


class InitDoc:
    """A class whose constructor documents itself."""

    def __init__(self, size: int) -> None:
        """Make one.

        Arguments:
            size: how big.
        """


class Shape(Protocol):
    """A protocol: never constructed, its signature not checked."""

    def area(self) -> float: ...


class Colour(enum.Enum):
    """An enum, left out."""

    RED = 1


def test_complete_lists_pass() -> None:
    assert lists.problems("complete", complete) == []
    assert lists.problems("no_arguments", no_arguments) == []
    assert lists.problems("InitDoc", InitDoc) == []
    assert lists.problems("Shape", Shape) == []


def test_a_parameter_without_an_entry_is_reported() -> None:
    assert lists.problems("f", missing_entry) == ["f: no Arguments: entry for 'b'"]


def test_an_entry_naming_no_parameter_is_reported() -> None:
    assert lists.problems("f", extra_entry) == ["f: Arguments: entry 'gone' names no parameter"]


def test_a_value_returned_without_returns_is_reported() -> None:
    expected = "f: returns a value but has no Returns: section"
    assert lists.problems("f", no_returns) == [expected]
    assert lists.problems("f", unannotated_return) == [expected]
    assert lists.problems("f", unannotated_without_value) == []


def test_a_dataclass_lists_its_constructor_fields() -> None:
    assert lists.problems("Fields", Fields) == ["Fields: no Arguments: entry for 'y'"]


def test_sections_are_read_at_the_docstring_level_only() -> None:
    found = lists.sections(complete.__doc__)
    assert found["Arguments"] == ["a", "rest", "b"]
    assert "Returns" in found


def test_package_problems_skips_exceptions_enums_and_names_left_out() -> None:
    package = types.SimpleNamespace(
        __name__="pkg",
        __all__=["Colour", "Error", "missing_entry", "no_returns"],
        Colour=Colour,
        Error=type("Error", (ValueError,), {}),
        missing_entry=missing_entry,
        no_returns=no_returns,
    )
    assert lists.package_problems(package, skip=["no_returns"]) == [
        "pkg.missing_entry: no Arguments: entry for 'b'"
    ]
