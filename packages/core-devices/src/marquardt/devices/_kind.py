"""The refusal every marquardt package makes of an argument of the wrong kind: the house
message with the type that was given in place of the value.
"""

from __future__ import annotations

from typing import TypeVar

from .messages import message

__all__ = ["wrong_kind"]

E = TypeVar("E", bound=Exception)


def wrong_kind(error: type[E], asked: str, given: object, hint: str) -> E:
    """``error`` with the house message ``asked``, ``got {type(given).__name__}``, ``hint``.

    Arguments:
        error: the exception class to build.
        asked: what was asked for, e.g. ``"LMA(loss_fn=...) expects a callable or None"``.
        given: what was given instead (its type's name is shown).
        hint: how to fix it.

    Returns:
        The exception, to raise.
    """
    return error(message(asked, f"got {type(given).__name__}", hint))
