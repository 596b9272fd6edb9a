"""The whole-number check the packages share: ints at or above a floor, never bools."""

from __future__ import annotations

import pytest

from marquardt.devices._whole import is_whole, require_whole


@pytest.mark.parametrize(
    ("value", "minimum", "expected"),
    [
        (1, 1, True),
        (0, 0, True),
        (0, 1, False),
        (-3, 0, False),
        (True, 0, False),
        (False, 0, False),
        (2.0, 1, False),
        ("2", 1, False),
        (None, 0, False),
    ],
)
def test_is_whole_takes_ints_at_or_above_the_floor(
    value: object, minimum: int, expected: bool
) -> None:
    assert is_whole(value, minimum) is expected


def test_require_whole_returns_the_value_or_raises_the_house_message() -> None:
    assert require_whole(4, 1, ValueError, "f(n=...) expects an integer ≥ 1", "pass n=4") == 4
    with pytest.raises(KeyError) as raised:
        require_whole(True, 1, KeyError, "f(n=...) expects an integer ≥ 1", "pass n=4")
    assert raised.value.args[0] == ("f(n=...) expects an integer ≥ 1, but got True. HINT: pass n=4")
