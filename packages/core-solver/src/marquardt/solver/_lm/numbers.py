"""The check of a numeric ``LMA`` argument, which the option checks and the stopping tests
share: `positive_number`."""

from __future__ import annotations

import math

from .._errors import SolverConfigError, message

__all__ = ["positive_number"]


def positive_number(name: str, value: object, *, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (≥ 0 with ``allow_zero``).

    Arguments:
        name: the keyword's name, for the message.
        value: what was passed.
        allow_zero: whether 0 is allowed.

    Returns:
        The number.

    Raises:
        SolverConfigError: not a number, not finite, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SolverConfigError(
            message(
                f"LMA({name}=...) expects a number",
                f"got {type(value).__name__}",
                f"pass a float, e.g. {name}=1.0",
            )
        )
    number = float(value)
    if not math.isfinite(number) or number < 0.0 or (number == 0.0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise SolverConfigError(
            message(
                f"LMA({name}=...) expects a finite number {bound}",
                f"got {value!r}",
                f"pass a finite {name} {bound}",
            )
        )
    return number
