"""The solver's saved state: `solver_state`, `checked_state` and `restored`.

What carries over from step to step is the damping rule's state (λ, and ν for Nielsen's
rule, Nielsen 1999) and the step count; the learning rate and scaling are saved for the
record. The model's parameters are not part of it (``lma.model.state_dict()`` holds them).
A state is checked whole before anything is restored, so a bad one changes nothing, and
strictly, as ``torch.nn.Module.load_state_dict`` is: a missing or an unexpected key (a
misspelt one) at the top level or in the damping rule's state is refused. With parameter
subsets, ``"param_selection"`` holds the selection's state (the layer cursor, the random
generator), so a resumed run selects what it would have. After a matrix-free step,
``"matrix_free"`` holds the conjugate gradients' warm start and the generator of their
curvature subsamples and sketches, so a resumed run takes the step it would have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from marquardt.devices._whole import require_whole

from .._errors import SolverStateError, message
from .damping.base import DampingRule
from .solve.cg import ConjugateGradients
from .subsets import ParamSelection

__all__ = ["STATE_FORMAT", "STATE_KEYS", "checked_state", "restored", "solver_state"]

STATE_FORMAT = "marquardt.solver.LMA/1"
#: The keys of a saved state, every one required.
STATE_KEYS = frozenset(
    ("format", "damping_rule", "damping_state", "steps", "learning_rate", "scaling")
)


def _check_keys(where: str, found: object, expected: frozenset[str]) -> None:
    """Refuse missing and unexpected keys, as torch's strict ``load_state_dict`` does."""
    keys = set(found) if isinstance(found, dict) else set()
    missing = sorted(expected - keys)
    unexpected = sorted(str(k) for k in keys - expected)
    if missing or unexpected:
        raise SolverStateError(
            message(
                f"load_state_dict expects {where} with exactly the keys {sorted(expected)}",
                f"missing keys {missing}, unexpected keys {unexpected}",
                "pass what LMA.state_dict() returned, unedited (check the spelling)",
            )
        )


def solver_state(
    rule: DampingRule,
    steps: int,
    learning_rate: float,
    scaling: str,
    selection: ParamSelection | None = None,
    matrix_free: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The dict ``LMA.state_dict`` returns (``matrix_free``: the conjugate gradients'
    state, after a matrix-free step)."""
    state: dict[str, Any] = {
        "format": STATE_FORMAT,
        "damping_rule": rule.name,
        "damping_state": dict(rule.state_dict()),
        "steps": steps,
        "learning_rate": learning_rate,
        "scaling": scaling,
    }
    if selection is not None:
        state["param_selection"] = selection.state_dict()
    if matrix_free is not None:
        state["matrix_free"] = matrix_free
    return state


def restored(
    state: object,
    rule: DampingRule,
    selection: ParamSelection | None,
    *,
    resumable: bool,
    sizes: Sequence[int],
    seed: int | None,
) -> tuple[ParamSelection | None, dict[str, float], int, dict[str, Any] | None]:
    """What ``LMA.load_state_dict`` restores, checked whole before anything changes.

    Arguments:
        state: what ``LMA.state_dict`` returned.
        rule: the solver's damping rule.
        selection: the solver's parameter selection (None: it steps on every parameter).
        resumable: whether a selection saved after the planner switched to subsets is
            resumed (the planner may choose subsets: nothing was forced).
        sizes: the sizes of the model's parameter tensors.
        seed: the random selection's seed.

    Returns:
        The selection, its state restored; the damping rule's state; the step count; the
        conjugate gradients' state (None: none saved).

    Raises:
        SolverStateError: the state does not fit this solver.
    """
    cg_state = state.get("matrix_free") if isinstance(state, dict) else None
    if cg_state is not None and isinstance(state, dict):
        ConjugateGradients.check_state(cg_state)
        state = {k: v for k, v in state.items() if k != "matrix_free"}
    saved = state.get("param_selection") if isinstance(state, dict) else None
    if selection is None and resumable and saved is not None:
        # Saved after the planner switched to subsets: resume the same way.
        selection = ParamSelection.resumed(saved, sizes, seed)
    if selection is not None and isinstance(state, dict):
        state = {k: v for k, v in state.items() if k != "param_selection"}
    damping_state, steps = checked_state(state, rule)
    if selection is not None:
        selection.load_state_dict(saved)
    return selection, damping_state, steps, cg_state


def checked_state(state: object, rule: DampingRule) -> tuple[dict[str, float], int]:
    """(damping state, steps) from a saved state for ``rule``; raises before any change."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise SolverStateError(
            message(
                f"load_state_dict expects a dict of format {STATE_FORMAT!r}",
                f"got {found!r}",
                "pass what LMA.state_dict() returned",
            )
        )
    _check_keys("a state", state, STATE_KEYS)
    if state.get("damping_rule") != rule.name:
        raise SolverStateError(
            message(
                f"load_state_dict was given the state of damping rule "
                f"{state.get('damping_rule')!r}",
                f"this solver uses {rule.name!r}",
                "construct the LMA with the same damping= as the one saved",
            )
        )
    damping_state = state.get("damping_state")
    _check_keys("damping_state", damping_state, frozenset(rule.state_dict()))
    if (
        not isinstance(damping_state, dict)
        or "damping" not in damping_state
        or not all(
            isinstance(v, (int, float)) and math.isfinite(float(v)) and float(v) > 0.0
            for v in damping_state.values()
        )
    ):
        raise SolverStateError(
            message(
                "load_state_dict expects damping_state with a finite positive 'damping'",
                f"got {damping_state!r}",
                "pass what LMA.state_dict() returned",
            )
        )
    steps = require_whole(
        state["steps"],
        0,
        SolverStateError,
        "load_state_dict expects 'steps' as an integer ≥ 0",
        "pass what LMA.state_dict() returned",
    )
    return {k: float(v) for k, v in damping_state.items()}, steps
