"""The damping rules (Marquardt 1963 fixed factors; Nielsen 1999 gain ratio)."""

from __future__ import annotations

import math

import pytest

from marquardt.solver import DampingRule, FixedDamping, NielsenDamping
from marquardt.solver._lm.damping.base import reported_gain_ratio


def test_fixed_rule_multiplies_and_clamps() -> None:
    rule = FixedDamping(1e-3, up=10.0, down=0.1, minimum=1e-5, maximum=1e-1)
    assert isinstance(rule, DampingRule)
    rule.on_reject()
    assert rule.damping == pytest.approx(1e-2)
    rule.on_reject()
    assert rule.damping == pytest.approx(1e-1) and rule.at_ceiling
    rule.on_reject()
    assert rule.damping == pytest.approx(1e-1), "clamped at the ceiling"
    for _ in range(10):
        rule.on_accept(1.0, 1.0)
    assert rule.damping == pytest.approx(1e-5), "clamped at the floor"
    assert not rule.at_ceiling


def test_fixed_rule_accepts_only_decrease() -> None:
    rule = FixedDamping(1.0, up=10.0, down=0.1, minimum=1e-9, maximum=1e9)
    assert rule.accepts(1e-3, -5.0), "the fixed rule looks at the actual reduction only"
    assert not rule.accepts(0.0, 1.0)
    assert not rule.accepts(-1.0, 1.0)
    assert not rule.accepts(math.nan, 1.0)


@pytest.mark.parametrize(
    ("rho", "factor"),
    [(1.0, 1.0 / 3.0), (0.5, 1.0), (0.75, 1.0 - 0.5**3), (0.25, 1.0 + 0.5**3), (1e-9, 2.0)],
)
def test_nielsen_update_on_accept(rho: float, factor: float) -> None:
    rule = NielsenDamping(1.0, minimum=1e-12, maximum=1e12)
    rule.on_reject()  # ν becomes 4; an acceptance must reset it to 2
    lam = rule.damping
    assert rule.accepts(rho, 1.0)
    rule.on_accept(rho, 1.0)
    assert rule.damping == pytest.approx(lam * max(1.0 / 3.0, factor), rel=1e-6)
    assert rule.nu == 2.0


def test_nielsen_rejections_double_nu() -> None:
    rule = NielsenDamping(1.0, minimum=1e-12, maximum=1e12)
    seen = []
    for _ in range(4):
        rule.on_reject()
        seen.append(rule.damping)
    assert seen == [2.0, 8.0, 64.0, 1024.0]
    assert rule.nu == 32.0


def test_nielsen_accepts_positive_gain_only() -> None:
    rule = NielsenDamping(1.0, minimum=1e-12, maximum=1e12)
    assert rule.accepts(0.1, 1.0)
    assert not rule.accepts(-0.1, 1.0)
    assert not rule.accepts(0.1, 0.0), "no positive prediction, no gain ratio"
    assert math.isnan(reported_gain_ratio(1.0, -1.0))


def test_nielsen_ceiling_and_state_round_trip() -> None:
    rule = NielsenDamping(1.0, minimum=1e-3, maximum=100.0)
    while not rule.at_ceiling:
        rule.on_reject()
    assert rule.damping == 100.0
    state = rule.state_dict()
    other = NielsenDamping(1.0, minimum=1e-3, maximum=100.0)
    other.load_state_dict(state)
    assert other.damping == rule.damping and other.nu == rule.nu
