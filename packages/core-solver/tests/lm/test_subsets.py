"""Block steps on parameter subsets: the full LM step restricted to the selected columns."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch
from torch import nn

from marquardt.jacobian import JacobianEngine, Replicas
from marquardt.solver import LMA, SolverConfigError, SolverStateError
from marquardt.solver._backends.base import Solution
from marquardt.solver._lm.subsets import SubsetSolver, layer_blocks


def _problem() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.linspace(-3, 3, 40).reshape(-1, 1)
    y = torch.sinc(x)
    return model.double(), x.double(), y.double()


def _residual(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a - b


def _expected(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor, lam: float, lr: float
) -> torch.Tensor:
    """θ after the full LM step (identity scaling) restricted to the columns ``index``."""
    reference = copy.deepcopy(model)
    engine = JacobianEngine(Replicas(reference, ["cpu"]), _residual)
    jac, res = engine.jacobian(x, y)
    n = jac.shape[0]
    js = jac[:, index]
    a = js.T @ js / n
    g = js.T @ res / n
    delta = torch.linalg.solve(a + lam * torch.eye(len(index), dtype=a.dtype), g)
    theta = engine.replicas.flat_params()
    theta[index] -= lr * delta
    return theta


@pytest.mark.parametrize("rule", ["layer", "random"])
def test_subset_step_is_the_full_step_restricted(rule: str) -> None:
    model, x, y = _problem()
    start = copy.deepcopy(model)
    lma = LMA(
        model,
        ["cpu"],
        _residual,
        scaling="identity",
        learning_rate=0.7,
        params_per_step=20,
        param_selection=rule,
        seed=11,
    )
    compared = 0
    for step in range(3):
        picked = copy.deepcopy(lma._selection)  # what the step will draw
        assert picked is not None
        with picked.drawn(step) as index:
            pass
        before = copy.deepcopy(model)
        lma.step(x, y)
        report = lma.report
        assert report is not None and report.selected == len(index) <= 20
        if report.accepted:
            expected = _expected(before, x, y, index, report.damping_used, 0.7)
            got = lma._replicas.flat_params()
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
            moved = torch.nonzero(got != Replicas(before, ["cpu"]).flat_params()).reshape(-1)
            assert set(moved.tolist()) <= set(index.tolist())
            compared += 1
    assert compared >= 2
    assert any(
        not torch.equal(p, q) for p, q in zip(start.parameters(), model.parameters(), strict=True)
    )


def test_layer_blocks_follow_the_tensors() -> None:
    # 1-8-8-1 MLP: W1 8, b1 8, W2 64, b2 8, W3 8, b3 1.
    assert layer_blocks([8, 8, 64, 8, 8, 1], 20) == [
        (0, 16),
        (16, 32),
        (32, 48),
        (48, 64),
        (64, 80),
        (80, 97),
    ]
    assert layer_blocks([5, 5], 100) == [(0, 10)]
    blocks = layer_blocks([512, 512, 262144, 512, 262144, 512, 512, 1], 4096)
    assert all(b - a <= 4096 for a, b in blocks)
    assert blocks[0] == (0, 1024) and blocks[-1][1] == 526849
    assert all(b0[1] == b1[0] for b0, b1 in itertools.pairwise(blocks))


def _run(steps: int, lma: LMA, x: torch.Tensor, y: torch.Tensor) -> None:
    for _ in range(steps):
        lma.step(x, y)


def test_random_selection_is_reproducible_and_resumes_identically() -> None:
    model, x, y = _problem()
    twin = copy.deepcopy(model)
    resumed_model = copy.deepcopy(model)
    a = LMA(model, ["cpu"], _residual, params_per_step=16, param_selection="random", seed=5)
    b = LMA(twin, ["cpu"], _residual, params_per_step=16, param_selection="random", seed=5)
    _run(4, a, x, y)
    _run(2, b, x, y)
    saved = copy.deepcopy(b.state_dict())
    saved_model = copy.deepcopy(twin.state_dict())
    # A fresh solver with another seed, resumed from the checkpoint, must continue as b.
    c = LMA(resumed_model, ["cpu"], _residual, params_per_step=16, param_selection="random", seed=9)
    resumed_model.load_state_dict(saved_model)
    c.load_state_dict(saved)
    _run(2, c, x, y)
    torch.testing.assert_close(
        Replicas(resumed_model, ["cpu"]).flat_params(), Replicas(model, ["cpu"]).flat_params(),
        rtol=0, atol=0,
    )  # fmt: skip


def test_layer_cursor_is_saved() -> None:
    model, x, y = _problem()
    lma = LMA(model, ["cpu"], _residual, params_per_step=20, param_selection="layer")
    _run(2, lma, x, y)
    state = lma.state_dict()
    assert state["param_selection"]["cursor"] == 2
    other = LMA(
        copy.deepcopy(model), ["cpu"], _residual, params_per_step=20, param_selection="layer"
    )
    other.load_state_dict(state)
    assert other.state_dict()["param_selection"]["cursor"] == 2


def test_callable_selection_and_its_limit() -> None:
    model, x, y = _problem()
    seen: list[int] = []

    def pick(step: int, params: int) -> list[int]:
        seen.append(params)
        return [0, 1, 2] if step == 0 else list(range(params))

    lma = LMA(model, ["cpu"], _residual, params_per_step=3, param_selection=pick)
    lma.step(x, y)
    assert seen == [97] and lma.report is not None and lma.report.selected == 3
    with pytest.raises(SolverConfigError, match="at most k = 3"):
        lma.step(x, y)


def test_subset_options_are_checked_first() -> None:
    model, _, _ = _problem()
    with pytest.raises(SolverConfigError, match="gtol"):
        LMA(model, ["cpu"], _residual, params_per_step=4, gtol=1e-8)
    with pytest.raises(SolverConfigError, match="param_selection"):
        LMA(model, ["cpu"], _residual, params_per_step=4, param_selection="rows")
    for wrong in (0, True, 2.5):
        with pytest.raises(SolverConfigError, match="params_per_step"):
            LMA(model, ["cpu"], _residual, params_per_step=wrong)


def test_state_without_selection_is_refused() -> None:
    model, _x, _y = _problem()
    plain = LMA(copy.deepcopy(model), ["cpu"], _residual)
    subset = LMA(model, ["cpu"], _residual, params_per_step=8, seed=1)
    with pytest.raises(SolverStateError, match="param_selection"):
        subset.load_state_dict(plain.state_dict())
    forced = LMA(copy.deepcopy(model), ["cpu"], _residual, strategy="accumulate")
    with pytest.raises(SolverStateError, match="param_selection"):
        forced.load_state_dict(subset.state_dict())
    # A bad state changes nothing, not even the choice of subsets.
    bad = dict(subset.state_dict())
    bad["steps"] = -1
    fresh = LMA(copy.deepcopy(model), ["cpu"], _residual)
    with pytest.raises(SolverStateError, match="steps"):
        fresh.load_state_dict(bad)
    assert "param_selection" not in fresh.state_dict()
    # Left to the planner, a solver resumes a subset run as subsets.
    plain.load_state_dict(subset.state_dict())
    assert plain.state_dict()["param_selection"]["k"] == 8


def test_subset_larger_than_batch_uses_the_dual_system() -> None:
    """N = 10 rows < k = 60 columns: the N × N system of J_S, δ_S = J_Sᵀu."""
    model, x, y = _problem()
    x, y = x[::4], y[::4]
    lma = LMA(model, ["cpu"], _residual, params_per_step=60, seed=2, scaling="identity")
    loss, _ = lma.step(x, y)
    assert lma.report is not None and lma.report.strategy == "explicit"
    assert lma.report.selected == 60 and loss <= lma.report.loss_before


def test_planner_switches_to_subsets_when_memory_is_short() -> None:
    """P = 97: the full step (N = 40 < P: the 40 × 40 dual with J whole) needs 111,128 B and
    the matrix-free step 56,848 B (its product chunk); with 56,000 B the planner picks the
    largest subset whose 24·k² takes half of what is left."""
    model, x, y = _problem()
    lma = LMA(model, ["cpu"], _residual, memory_limit=56_000, seed=4)
    with pytest.warns(UserWarning, match=r"random subsets of k = \d+"):
        loss, _ = lma.step(x, y)
    report = lma.report
    assert report is not None and 0 < report.selected < 97
    assert loss < report.loss_before
    state = lma.state_dict()
    assert state["param_selection"]["k"] == report.selected
    # A fresh solver resumes into the same subsets without another switch.
    other = LMA(copy.deepcopy(model), ["cpu"], _residual, memory_limit=56_000, seed=8)
    other.load_state_dict(state)
    assert other.state_dict()["param_selection"]["k"] == report.selected


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"strategy": "accumulate"}, "strategy='accumulate' on all 97 parameters"),
        ({"params_per_step": 90}, "params_per_step=90"),
    ],
)
def test_forced_plan_that_cannot_fit_is_refused_before_any_work(
    kwargs: dict[str, object], what: str
) -> None:
    model, x, y = _problem()
    before = Replicas(copy.deepcopy(model), ["cpu"]).flat_params()
    lma = LMA(model, ["cpu"], _residual, memory_limit=100_000, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(SolverConfigError) as caught:
        lma.step(x, y)
    text = str(caught.value)
    assert what in text and "memory_limit=100000" in text
    assert "HINT: pass params_per_step=" in text
    assert lma.steps == 0 and lma.report is None
    torch.testing.assert_close(lma._replicas.flat_params(), before, rtol=0, atol=0)


def test_memory_limit_is_checked() -> None:
    model, _, _ = _problem()
    with pytest.raises(SolverConfigError, match="memory_limit"):
        LMA(model, ["cpu"], _residual, memory_limit=0)


def test_a_subset_solve_scatters_delta_and_keeps_the_inner_solves_terms() -> None:
    inner_solution = Solution(
        delta=torch.tensor([2.0, 3.0], dtype=torch.float64),
        gradient_dot=0.5,
        curvature=0.25,
        damping=1e-3,
        status=0.0,
        iterations=7,
        stop="tolerance",
    )

    class Inner:
        name = "stand-in"

        def solve(self, system: Any, damping: float, scaling: str) -> Solution | None:
            return inner_solution

        def accept(self) -> None:
            pass

    solver = SubsetSolver(Inner(), torch.tensor([1, 3]), 4)
    solved = solver.solve(None, 1e-3, "identity")  # type: ignore[arg-type]
    assert solved is not None
    assert solved.delta.tolist() == [0.0, 2.0, 0.0, 3.0]
    kept = ("gradient_dot", "curvature", "damping", "status", "iterations", "stop")
    assert [getattr(solved, k) for k in kept] == [getattr(inner_solution, k) for k in kept]
