"""LMA: learning rate, λ across batches, strategies, stopping tests, state, bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from problems import cpu_lma, linear_solution, problem, residual_fn, run_to_convergence
from torch import nn

from marquardt.solver import (
    LMA,
    SolverConfigError,
    SolverInputError,
    SolverStateError,
    StepReport,
)
from marquardt.testing.models import flat


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_learning_rate_moves_part_of_the_way(backend: str) -> None:
    prob = problem("linear")
    lma, model = cpu_lma(
        prob,
        learning_rate=0.5,
        damping="nielsen",
        damping_start=1e-14,
        damping_min=1e-15,
        backend=backend,
    )
    start = flat(model)
    lma.step(prob.x, prob.y)
    expected = start + 0.5 * (linear_solution(prob) - start)
    torch.testing.assert_close(flat(model), expected, rtol=1e-8, atol=1e-10)
    report = lma.report
    assert report is not None and report.accepted
    # The prediction includes lr: for a linear model it is exact, so ρ = 1.
    assert report.gain_ratio == pytest.approx(1.0, rel=1e-6)


def test_damping_carries_over_between_batches() -> None:
    prob = problem("exponential")
    model = prob.make_model()
    # The fixed rule: λ × 0.1 on acceptance, so the carried-over value is exact.
    lma = LMA(model, ["cpu"], residual_fn, damping="fixed", damping_start=1e-2, backend="numpy")
    lma.step(prob.x[:20], prob.y[:20])
    assert lma.report is not None and lma.report.accepted
    assert lma.damping == pytest.approx(1e-3)
    lma.step(prob.x[20:], prob.y[20:])
    assert lma.report is not None
    first = 1e-3 if lma.report.attempts == 1 else None
    if first is not None:
        assert lma.report.damping_used == pytest.approx(first)
    assert lma.steps == 2


def test_underdetermined_step_interpolates_with_minimum_norm() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 10, generator=g, dtype=torch.float64)
    y = torch.randn(5, 1, generator=g, dtype=torch.float64)
    torch.manual_seed(1)
    model = nn.Linear(10, 1, dtype=torch.float64)
    start = flat(model)
    lma = LMA(model, ["cpu"], residual_fn, damping_start=1e-12, damping_min=1e-13, backend="torch")
    lma.step(x, y)
    report = lma.report
    assert report is not None and report.strategy == "explicit" and report.rows == 5
    assert report.params == 11
    with torch.no_grad():
        assert float(((model(x) - y) ** 2).mean()) < 1e-16
    design = torch.cat([x, torch.ones(5, 1, dtype=torch.float64)], dim=1)
    with torch.no_grad():
        r = (design @ start.reshape(-1, 1)[[*range(10), 10]] - y).reshape(-1)
    change = torch.linalg.pinv(design) @ (-r)
    torch.testing.assert_close(flat(model) - start, change, rtol=1e-6, atol=1e-9)


def test_auto_strategy_accumulates_when_overdetermined() -> None:
    prob = problem("exponential")
    lma = LMA(prob.make_model(), ["cpu"], residual_fn, backend="numpy")
    lma.step(prob.x, prob.y)
    assert lma.report is not None and lma.report.strategy == "accumulate"


def test_report_fields() -> None:
    prob = problem("rational")
    lma = LMA(prob.make_model(), ["cpu"], residual_fn, backend="torch")
    loss, terminated = lma.step(prob.x, prob.y)
    report = lma.report
    assert isinstance(report, StepReport)
    assert report.backend == "torch" and report.rows == 30 and report.params == 3
    assert report.loss_after == loss < report.loss_before
    assert report.attempts >= 1 and report.accepted and not terminated
    timings = [v for k, v in report.as_dict().items() if k.startswith("seconds")]
    assert all(t >= 0.0 for t in timings)
    assert report.seconds_total >= report.seconds_solve + report.seconds_trial


def test_custom_loss_decides_acceptance() -> None:
    prob = problem("exponential")
    lma, model = cpu_lma(
        prob,
        loss_fn=lambda out, y: 3.0 * ((out - y) ** 2).mean(),
        damping="nielsen",
        backend="numpy",
    )
    loss, _ = lma.step(prob.x, prob.y)
    assert lma.report is not None and lma.report.accepted
    with torch.no_grad():
        mse = float(((model(prob.x) - prob.y) ** 2).mean())
    assert loss == pytest.approx(3.0 * mse, rel=1e-10)

    stuck, frozen = cpu_lma(
        prob, loss_fn=lambda out, y: out.sum() * 0.0 + 1.0, attempts=3, backend="numpy"
    )
    before = flat(frozen)
    stuck.step(prob.x, prob.y)
    assert stuck.report is not None and not stuck.report.accepted
    assert stuck.report.rejections == ["loss did not decrease"] * 3
    assert torch.equal(flat(frozen), before)


@pytest.mark.parametrize(
    ("option", "reason"), [("ftol", "ftol"), ("xtol", "xtol"), ("gtol", "gtol")]
)
def test_minpack_criteria_terminate_with_their_reason(option: str, reason: str) -> None:
    prob = problem("exponential")
    lma = LMA(prob.make_model(), ["cpu"], residual_fn, backend="numpy", **{option: 1e-6})  # type: ignore[arg-type]
    run_to_convergence(lma, prob, max_steps=200)
    assert lma.report is not None and lma.report.termination == reason


def test_state_dict_round_trip() -> None:
    prob = problem("rational")
    model = prob.make_model()
    lma = LMA(model, ["cpu"], residual_fn, damping="nielsen", backend="numpy")
    for _ in range(2):
        lma.step(prob.x, prob.y)
    twin = copy.deepcopy(model)
    state = lma.state_dict()
    other = LMA(twin, ["cpu"], residual_fn, damping="nielsen", backend="numpy")
    other.load_state_dict(state)
    assert other.damping == lma.damping and other.steps == lma.steps
    assert other.state_dict() == state
    lma.step(prob.x, prob.y)
    other.step(prob.x, prob.y)
    torch.testing.assert_close(flat(twin), flat(model), rtol=0, atol=0)
    assert other.damping == lma.damping


def test_bad_state_dict_changes_nothing() -> None:
    prob = problem("rational")
    lma = LMA(prob.make_model(), ["cpu"], residual_fn, damping="fixed", backend="numpy")
    lma.step(prob.x, prob.y)
    before = lma.state_dict()
    with pytest.raises(SolverStateError, match="format"):
        lma.load_state_dict({"damping": 1.0})
    nielsen = LMA(prob.make_model(), ["cpu"], residual_fn, damping="nielsen", backend="numpy")
    with pytest.raises(SolverStateError, match=r"damping rule 'nielsen'.*HINT"):
        lma.load_state_dict(nielsen.state_dict())
    broken = dict(before, damping_state={"damping": math.nan})
    with pytest.raises(SolverStateError, match="HINT"):
        lma.load_state_dict(broken)
    assert lma.state_dict() == before


BAD_BATCHES = [
    ("nan inputs", lambda x, y: (x.clone().fill_(math.nan), y), None, "finite inputs"),
    ("inf targets", lambda x, y: (x, y.clone().fill_(math.inf)), None, "finite targets"),
    ("length mismatch", lambda x, y: (x, y[:-1]), None, "as many targets as inputs"),
    ("empty", lambda x, y: (x[:0], y[:0]), None, "at least one sample"),
    ("not a tensor", lambda x, y: (x.tolist(), y), None, "torch.Tensor"),
    ("zero slice", lambda x, y: (x, y), 0, "slice_size"),
    ("float slice", lambda x, y: (x, y), 2.5, "slice_size"),
    ("bool slice", lambda x, y: (x, y), True, "slice_size"),
    ("scalar", lambda x, y: (x[0, 0], y[0, 0]), None, "batched"),
]


@pytest.mark.parametrize(
    ("label", "make", "slice_size", "text"), BAD_BATCHES, ids=[b[0] for b in BAD_BATCHES]
)
def test_bad_input_fails_before_any_work(label, make, slice_size, text) -> None:  # type: ignore[no-untyped-def]
    prob = problem("exponential")
    model = prob.make_model()
    lma = LMA(model, ["cpu"], residual_fn, backend="numpy")
    lma.step(prob.x, prob.y)
    before, damping, steps, report = flat(model), lma.damping, lma.steps, lma.report
    x, y = make(prob.x, prob.y)
    with pytest.raises(SolverInputError, match="HINT") as info:
        lma.step(x, y, slice_size)
    assert text in str(info.value)
    assert torch.equal(flat(model), before)
    assert (lma.damping, lma.steps, lma.report) == (damping, steps, report)


BAD_CONFIG = [
    ({"learning_rate": 0.0}, "learning_rate"),
    ({"learning_rate": math.nan}, "learning_rate"),
    ({"damping": "levenberg"}, "damping rule"),
    ({"damping": 3}, "DampingRule"),
    ({"scaling": "more"}, "scaling"),
    ({"attempts": 0}, "attempts"),
    ({"strategy": "gauss"}, "strategy"),
    ({"backend": "jax"}, "backend"),
    ({"damping_min": 1.0, "damping_max": 0.1}, "damping_min ≤ damping_max"),
    ({"damping_up": 1.0}, "damping_up > 1"),
    ({"damping_down": 2.0}, "damping_down < 1"),
    ({"dtype": torch.int32}, "floating torch.dtype"),
    ({"ftol": -1.0}, "ftol"),
]


@pytest.mark.parametrize(("kwargs", "text"), BAD_CONFIG, ids=[str(c[0]) for c in BAD_CONFIG])
def test_bad_configuration_is_refused(kwargs: dict[str, object], text: str) -> None:
    prob = problem("exponential")
    model = prob.make_model()
    before = flat(model)
    params_before = [p.data_ptr() for p in model.parameters()]
    with pytest.raises(SolverConfigError, match="HINT") as info:
        LMA(model, ["cpu"], residual_fn, **kwargs)  # type: ignore[arg-type]
    assert text in str(info.value)
    assert torch.equal(flat(model), before)
    assert [p.data_ptr() for p in model.parameters()] == params_before


def test_devices_must_be_a_list() -> None:
    prob = problem("exponential")
    with pytest.raises(SolverConfigError, match="list of devices"):
        LMA(prob.make_model(), "cpu", residual_fn)  # type: ignore[arg-type]


def test_model_property_is_the_trained_model() -> None:
    prob = problem("exponential")
    model = prob.make_model()
    lma = LMA(model, [torch.device("cpu")], residual_fn)
    assert lma.model is model
    assert lma.devices == [torch.device("cpu")]
