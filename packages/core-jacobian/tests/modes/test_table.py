"""The mode table drives every choice: the residual forms a mode serves decide whether the
planner may pick it, its memory sizes the chunks, its function forms ``J``, and an unknown
mode's error names the table's modes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from torch import nn

from marquardt.jacobian import JacobianEngine, Replicas, UnknownModeError, plan_jacobian
from marquardt.jacobian._modes import MODE_TABLE, JacobianMode, ModeCall
from marquardt.jacobian._modes._table import OUTPUTS, POINTS

BUDGET = 1 << 30


@pytest.fixture
def fake() -> Iterator[list[ModeCall]]:
    """A mode ``fake`` first in the table (``auto`` prefers it wherever it applies), serving
    the form ``OUTPUTS`` only, by vmap's function; the calls it served are recorded."""
    calls: list[ModeCall] = []
    vmap = MODE_TABLE["vmap"]

    def counted(replica, residual, call):  # type: ignore[no-untyped-def]
        calls.append(call)
        return vmap.forms[OUTPUTS](replica, residual, call)

    entry = JacobianMode(
        name="fake",
        forms={OUTPUTS: counted},
        memory=lambda s: s.item * s.params,
        fallback="vmap",
    )
    saved = dict(MODE_TABLE)
    MODE_TABLE.clear()
    MODE_TABLE.update({"fake": entry, **saved})
    try:
        yield calls
    finally:
        MODE_TABLE.clear()
        MODE_TABLE.update(saved)


def _plan(**kwargs: object):  # type: ignore[no-untyped-def]
    return plan_jacobian(10_000, 50, 1, torch.float64, BUDGET, **kwargs)  # type: ignore[arg-type]


def test_served_forms_decide_what_the_planner_may_pick(fake: list[ModeCall]) -> None:
    assert _plan().mode == "fake"
    points = _plan(form=POINTS)
    assert points.mode == "vmap" and "PointResidual" in points.reason
    refused = _plan(form=POINTS, mode="fake")
    assert refused.mode == "vmap"
    assert "fake was requested but" in refused.reason and "PointResidual" in refused.reason


def test_a_mode_that_serves_points_is_picked_for_them(fake: list[ModeCall]) -> None:
    MODE_TABLE["fake"] = replace(
        MODE_TABLE["fake"], forms={POINTS: MODE_TABLE["vmap"].forms[POINTS]}
    )
    assert _plan(form=POINTS).mode == "fake"
    assert _plan().mode == "layers"  # outputs: the fake no longer serves them


def test_layers_never_serve_point_residuals_whatever_the_model() -> None:
    assert _plan(layers_supported=True).mode == "layers"
    plan = _plan(form=POINTS, layers_supported=True, mode="layers")
    assert plan.mode == "vmap" and "layers was requested but" in plan.reason


def test_the_table_memory_sizes_the_chunks(fake: list[ModeCall]) -> None:
    # fake: P numbers of 8 bytes per sample; a budget of 3 samples gives chunks of 3.
    plan = plan_jacobian(10_000, 50, 1, torch.float64, 3 * 50 * 8)
    assert plan.mode == "fake" and plan.samples_per_chunk == 3
    assert plan.chunk_bytes == 3 * 50 * 8


def test_the_engine_runs_the_function_of_the_table(fake: list[ModeCall]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    x = torch.randn(12, 2, dtype=torch.float64)
    y = torch.randn(12, 1, dtype=torch.float64)
    engine = JacobianEngine(Replicas(model, ["cpu"]), lambda a, b: a - b)
    jac, _ = engine.jacobian(x, y)
    assert engine.last_plan is not None and engine.last_plan.mode == "fake"
    assert len(fake) >= 1
    ref = JacobianEngine(Replicas(model, ["cpu"]), lambda a, b: a - b, mode="vmap")
    torch.testing.assert_close(jac, ref.jacobian(x, y)[0])


def test_an_unknown_mode_names_the_table(fake: list[ModeCall]) -> None:
    with pytest.raises(
        UnknownModeError, match=r"auto, fake, broadcast, layers, taylor, jacfwd, vmap"
    ):
        _plan(mode="jacrevv")
    model = nn.Linear(2, 1).double()
    with pytest.raises(UnknownModeError, match=r"mode='jacrevv'.*fake"):
        JacobianEngine(Replicas(model, ["cpu"]), lambda a, b: a - b, mode="jacrevv")
    # A name of the table is accepted by the engine as by the planner.
    assert JacobianEngine(Replicas(model, ["cpu"]), lambda a, b: a - b, mode="fake")


def test_every_fallback_ends_at_a_mode_serving_every_form() -> None:
    for entry in MODE_TABLE.values():
        while entry.fallback is not None:
            entry = MODE_TABLE[entry.fallback]
        assert entry.serves(OUTPUTS) and entry.serves(POINTS) and entry.support is None
