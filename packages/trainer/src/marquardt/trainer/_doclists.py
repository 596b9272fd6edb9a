"""Argument lists that several public classes share, written once, added to their docstrings.

``@with_lists(LISTS)`` appends ``LISTS`` (an ``Arguments:`` list, perhaps a ``Raises:``
list) to the docstring of the class it decorates when its module is imported, so
``help()`` and the docstring checks see them; the API reference, which reads the sources
without importing them, gets the same lists from ``tools/griffe_shared_lists.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", bound=type)


def with_lists(lists: str) -> Callable[[T], T]:
    """A class decorator: the class's docstring, then ``lists``.

    Arguments:
        lists: the lists the classes share, as they read in a docstring.

    Returns:
        The decorator, which returns the class it is given.
    """

    def add(cls: T) -> T:
        cls.__doc__ = f"{inspect.cleandoc(cls.__doc__ or '')}\n\n{inspect.cleandoc(lists)}\n"
        return cls

    return add
