"""The check every marquardt package makes of a count or a size it is given: a whole number
(an ``int``, never a ``bool``) at or above a floor.
"""

from __future__ import annotations

from typing import TypeGuard

from .messages import message

__all__ = ["is_whole", "require_whole"]


def is_whole(value: object, minimum: int) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` (a ``bool`` is not) and at least ``minimum``.

    Arguments:
        value: what was given.
        minimum: the smallest value allowed.

    Returns:
        True for a whole number ≥ ``minimum``.
    """
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def require_whole(
    value: object, minimum: int, error: type[Exception], asked: str, hint: str
) -> int:
    """``value`` when it is a whole number ≥ ``minimum``; else ``error`` with the house
    message ``asked``, ``got {value!r}``, ``hint``.

    Arguments:
        value: what was given.
        minimum: the smallest value allowed.
        error: the exception class to raise.
        asked: what was asked for, e.g. ``"LMA(attempts=...) expects an integer ≥ 1"``.
        hint: how to fix it.

    Returns:
        ``value``.

    Raises:
        Exception: ``error``, when ``value`` is not a whole number ≥ ``minimum``.
    """
    if not is_whole(value, minimum):
        raise error(message(asked, f"got {value!r}", hint))
    return value
