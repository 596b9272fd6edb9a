"""What the registry of stopping tests holds for each test: `StopKind`, and what a test
reads: `StopFacts`.

A test belongs to one moment of a step (its *phase*): ``"before"`` the attempts (on the
assembled system), after an ``"accepted"`` attempt, after a ``"rejected"`` one, when λ
reaches its ``"ceiling"``, or once the ``"step"`` is over. The loops fill the facts of
that moment and ask every test of the phase (``stopping.Stops``), in registry order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["PHASES", "StopFacts", "StopKind"]

#: The moments of a step at which tests are asked.
PHASES: tuple[str, ...] = ("before", "accepted", "rejected", "ceiling", "step")


@dataclass(frozen=True)
class StopFacts:
    """What a stopping test may read; each phase fills its own fields.

    Arguments:
        loss_before: the loss L at the start of the step.
        system: the step's assembled system (``"before"``).
        actual: the attempt's actual reduction of the loss.
        predicted: its predicted reduction (the loss's units).
        step_norm: ‖s‖ of the accepted step.
        param_norm: ‖θ‖ before the step (0 unless a test asked for it: `StopKind.needs`).
        rounding: whether the rejected attempt predicted less than the loss's rounding.
        bound: the loss's rounding, ``NOISE_ULPS``·ε·|L|.
        maximum: λ's ceiling.
        attempts: the attempts of the step so far.
        rejections: why each was rejected.
        seconds: the seconds since the solver's first step began (``"step"``).
        steps: the steps taken, this one included (``"step"``).
    """

    loss_before: float = float("nan")
    system: Any = None
    actual: float = float("nan")
    predicted: float = float("nan")
    step_norm: float = 0.0
    param_norm: float = 0.0
    rounding: bool = False
    bound: float = 0.0
    maximum: float = float("inf")
    attempts: int = 0
    rejections: tuple[str, ...] = ()
    seconds: float = 0.0
    steps: int = 0


@dataclass(frozen=True)
class StopKind:
    """One stopping test as the registry holds it.

    Arguments:
        name: the test's name: its option's name and ``StepReport.termination`` when it
            holds.
        phase: when it is asked (`PHASES`).
        met: ``met(value, facts)``: the sentence for the report when the test holds with
            its option ``value``, else None.
        check: the option's check, ``check(value)`` -> the checked value (raises
            `SolverConfigError`); None for a test that is always on and takes no option.
        needs: what the loops must measure for it (``"param_norm"``), beyond the facts
            every phase fills.
    """

    name: str
    phase: str
    met: Callable[[Any, StopFacts], str | None]
    check: Callable[[object], object] | None = None
    needs: tuple[str, ...] = ()
