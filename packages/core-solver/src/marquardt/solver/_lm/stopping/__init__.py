"""Stopping: every test of an `LMA` step, its name and its option's check, in one registry:
`STOPPING`, `register_stop`, and `Stops`, the tests one solver was asked for.

Each test is a module (``ftol``, ``xtol``, ``gtol``: MINPACK's mean-loss tests on
L = ‖r‖²/N, Moré, Garbow & Hillstrom 1980; ``rounding`` and ``ceiling``, always on) with its
`StopKind`; adding one is a new module and one line of `STOPPING` (or `register_stop` at
run time). The eager and the tensor attempts and the step ask `Stops.first` at each phase;
the first test that holds names ``StepReport.termination`` and writes its sentence. SciPy's
fit tests of the curve fits (``_rules``) are another set, on the cost of one fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._errors import SolverConfigError, message
from ..registry import Registry
from ..report import StepReport
from . import ceiling, ftol, gtol, rounding, xtol
from .kind import PHASES, StopFacts, StopKind

__all__ = ["STOPPING", "StopFacts", "StopKind", "Stops", "register_stop"]

#: The stopping tests by name, asked in this order within a phase.
STOPPING: Registry[StopKind] = Registry(
    gtol.KIND, ftol.KIND, xtol.KIND, rounding.KIND, ceiling.KIND
)


def register_stop(kind: StopKind) -> None:
    """Add a stopping test to the registry (or replace the one of that name).

    Arguments:
        kind: the test's `StopKind`; its phase one of ``PHASES``.

    Raises:
        SolverConfigError: an unknown phase.
    """
    if kind.phase not in PHASES:
        raise SolverConfigError(
            message(
                f"a stopping test asked at phase {kind.phase!r}",
                f"the phases are {PHASES}",
                "choose one of them",
            )
        )
    STOPPING.add(kind)


class Stops:
    """The stopping tests of one solver: those always on, and those given an option, as the
    registry held them when the solver was built.

    Arguments:
        values: each test's option by name (None or absent: off); checked by its kind.

    Raises:
        SolverConfigError: a name that is no test, or a test that takes no option.
    """

    def __init__(self, values: Mapping[str, object]) -> None:
        self.values: dict[str, Any] = {}
        for name, value in values.items():
            kind = STOPPING.get(name)
            if kind is None or kind.check is None:
                raise SolverConfigError(
                    message(
                        f"LMA(stopping={{{name!r}: ...}}) names a stopping test with an option",
                        f"those are {tuple(k for k, v in STOPPING.items() if v.check)}",
                        "pass one of them, or register the test (stopping.register_stop)",
                    )
                )
            if value is not None:
                self.values[name] = kind.check(value)
        #: The tests that are on, by phase, in registry order.
        self._asked: dict[str, list[StopKind]] = {phase: [] for phase in PHASES}
        for name, kind in STOPPING.items():
            if kind.check is None or name in self.values:
                self._asked[kind.phase].append(kind)

    def asks(self, phase: str) -> bool:
        """Whether any test that is on is asked at ``phase``.

        Arguments:
            phase: one of ``PHASES``.

        Returns:
            True when `first` may find one.
        """
        return bool(self._asked[phase])

    def wants(self, what: str) -> bool:
        """Whether a test that is on needs ``what`` measured (`StopKind.needs`).

        Arguments:
            what: e.g. ``"param_norm"``.

        Returns:
            True when some test needs it.
        """
        return any(what in kind.needs for kinds in self._asked.values() for kind in kinds)

    def first(self, phase: str, facts: StopFacts) -> tuple[str, str] | None:
        """The first test of ``phase`` that holds, in registry order.

        Arguments:
            phase: one of ``PHASES``.
            facts: what the tests of the phase read.

        Returns:
            (its name, its sentence), or None when none holds.
        """
        for kind in self._asked[phase]:
            sentence = kind.met(self.values.get(kind.name), facts)
            if sentence is not None:
                return kind.name, sentence
        return None

    def stop(self, phase: str, facts: StopFacts, report: StepReport) -> bool:
        """Ask the tests of ``phase``; the first that holds names the report's termination.

        Arguments:
            phase: one of ``PHASES``.
            facts: what the tests of the phase read.
            report: the step's report; receives ``termination`` and ``reason``.

        Returns:
            Whether a test held (the run should stop).
        """
        found = self.first(phase, facts)
        if found is None:
            return False
        report.termination, report.reason = found
        return True
