"""Every CPU backend × damping rule × strategy on every problem of the shared suite.

With the default scaling (Marquardt's D = diag(JᵀJ)); D = I is checked on the NumPy
backend for every damping rule and strategy.

The final cost must be within 1e-10 relative of MINPACK's LM (scipy.optimize.least_squares,
method="lm") from the same start, or lower, and, for the NIST StRD problems, reach the
certified residual sum of squares. NumPy and torch must produce the same iterates.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from problems import (
    CPU_BACKENDS,
    DAMPINGS,
    PROBLEM_NAMES,
    STRATEGIES,
    assert_matches_scipy,
    problem,
    residual_fn,
    scipy_reference,
    solve_problem,
)

from marquardt.solver import LMA


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("damping", DAMPINGS)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", PROBLEM_NAMES)
def test_reaches_minpack_cost(name: str, backend: str, damping: str, strategy: str) -> None:
    assert_matches_scipy(name, backend=backend, damping=damping, strategy=strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("damping", DAMPINGS)
@pytest.mark.parametrize("name", PROBLEM_NAMES)
def test_identity_scaling_reaches_minpack_cost(name: str, damping: str, strategy: str) -> None:
    """D = I (no longer the default) still reaches MINPACK's cost on every problem."""
    _, prob, model, steps = solve_problem(
        name, backend="numpy", damping=damping, strategy=strategy, scaling="identity"
    )
    rss = prob.rss(model)
    _, reference = scipy_reference(name)
    assert rss <= reference * (1 + 1e-10) + 1e-24, (
        f"{name} [numpy/{damping}/{strategy}/identity]: rss {rss!r} after {steps} steps, "
        f"MINPACK reached {reference!r}"
    )


@pytest.mark.parametrize("name", ["misra1a", "mgh09", "mgh10"])
def test_certified_parameters(name: str) -> None:
    """The NIST certified values (11 significant digits) to 1e-6 relative."""
    _, prob, model, _ = solve_problem(
        name, backend="torch", damping="nielsen", strategy="accumulate"
    )
    assert prob.certified_params is not None
    found = prob.params(model).numpy()
    np.testing.assert_allclose(found, prob.certified_params, rtol=1e-6)


def _trajectory(name: str, backend: str, damping: str, strategy: str, steps: int) -> np.ndarray:
    prob = problem(name)
    model = prob.make_model()
    lma = LMA(model, ["cpu"], residual_fn, backend=backend, damping=damping, strategy=strategy)
    points = []
    for _ in range(steps):
        lma.step(prob.x, prob.y)
        points.append(prob.params(model).numpy().copy())
    return np.array(points)


@pytest.mark.parametrize("damping", DAMPINGS)
@pytest.mark.parametrize("name", PROBLEM_NAMES)
def test_numpy_and_torch_iterates_agree(name: str, damping: str) -> None:
    """Same iterates (relative 1e-8) over the first steps, both strategies."""
    for strategy in STRATEGIES:
        a = _trajectory(name, "numpy", damping, strategy, 12)
        b = _trajectory(name, "torch", damping, strategy, 12)
        scale = np.maximum(np.abs(a), 1e-12)
        assert float(np.max(np.abs(a - b) / scale)) < 1e-8, (name, strategy)


def test_linear_one_undamped_step_lands_on_solution() -> None:
    from problems import linear_solution

    prob = problem("linear")
    for backend in CPU_BACKENDS:
        model = prob.make_model()
        lma = LMA(
            model, ["cpu"], residual_fn, backend=backend, damping_start=1e-14, damping_min=1e-15
        )
        start_rss = prob.rss(model)
        lma.step(prob.x, prob.y)
        assert lma.report is not None and lma.report.accepted
        found = prob.params(model)
        torch.testing.assert_close(found, linear_solution(prob), rtol=1e-9, atol=1e-10)
        assert prob.rss(model) < start_rss
