"""The house form of every marquardt error message, shared by all its packages.

A message says what was asked, what was found, and how to fix it, in that order, and
ends with ``HINT:``. The other packages build their messages here (``marquardt.devices``
is the lowest of them), so the form has one home.
"""

from __future__ import annotations

__all__ = ["message", "with_hint"]


def message(asked: str, found: str, hint: str) -> str:
    """The house message: ``"{asked}, but {found}. HINT: {hint}"``.

    Arguments:
        asked: what the caller asked for, e.g. ``"LMA(slice_size=0)"``.
        found: what was found instead, e.g. ``"slice_size must be >= 1"``.
        hint: how to fix it, e.g. ``"use None for the whole batch"``.

    Returns:
        The message text.
    """
    return f"{asked}, but {found}. HINT: {hint}"


def with_hint(text: str, hint: str) -> str:
    """A message whose first part is given whole (a peer's wording kept for its users, or a
    sentence that already says what was asked and found), followed by ``HINT: {hint}``.

    Arguments:
        text: the message before the hint, ending with its own punctuation.
        hint: how to fix it.

    Returns:
        The message text.
    """
    return f"{text} HINT: {hint}"
