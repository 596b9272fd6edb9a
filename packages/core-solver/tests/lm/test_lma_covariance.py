"""LMA.covariance / standard_errors at the last accepted point, and strict state loading."""

from __future__ import annotations

import pytest
import torch
from problems import linear_solution, problem, residual_fn, run_to_convergence

from marquardt.solver import LMA, CovarianceWarning, SolverStateError


def test_linear_model_covariance_is_the_ols_one() -> None:
    """For y = Xw + b the covariance is s²(AᵀA)⁻¹ with A = [X, 1], s² = RSS/(N − P)."""
    prob = problem("linear")
    model = prob.make_model()
    lma = LMA(model, ["cpu"], residual_fn, damping_start=1e-14, damping_min=1e-15)
    run_to_convergence(lma, prob, 20)
    design = torch.cat([prob.x, torch.ones(prob.rows, 1, dtype=torch.float64)], dim=1)
    solution = linear_solution(prob)
    rss = float(((design @ solution - prob.y.reshape(-1)) ** 2).sum())
    expected = rss / (prob.rows - 5) * torch.linalg.inv(design.T @ design)
    pcov = lma.covariance(prob.x, prob.y)
    torch.testing.assert_close(pcov, expected, rtol=1e-8, atol=1e-14)
    torch.testing.assert_close(
        lma.standard_errors(prob.x, prob.y, slice_size=7), torch.sqrt(torch.diagonal(expected))
    )
    absolute = lma.covariance(prob.x, prob.y, absolute_sigma=True)
    torch.testing.assert_close(absolute, torch.linalg.inv(design.T @ design), rtol=1e-8, atol=0)


def test_nonlinear_covariance_matches_autograd_jacobian() -> None:
    prob = problem("rational")
    model = prob.make_model()
    lma = LMA(model, ["cpu"], residual_fn, damping_min=1e-12)
    run_to_convergence(lma, prob, 200)
    theta = next(model.parameters()).detach().clone()

    def residuals(b: torch.Tensor) -> torch.Tensor:
        return (model.f(b, prob.x) - prob.y).reshape(-1)

    jac = torch.autograd.functional.jacobian(residuals, theta)
    r = residuals(theta)
    expected = float(r @ r) / (prob.rows - 3) * torch.linalg.inv(jac.T @ jac)
    torch.testing.assert_close(lma.covariance(prob.x, prob.y), expected, rtol=1e-9, atol=0)


def test_covariance_of_an_unidentifiable_model_is_inf() -> None:
    x = torch.linspace(0, 1, 10, dtype=torch.float64).unsqueeze(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(1, 1, dtype=torch.float64), torch.nn.Linear(1, 1, dtype=torch.float64)
    )
    lma = LMA(model, ["cpu"], residual_fn)
    with pytest.warns(CovarianceWarning, match="rank"):
        pcov = lma.covariance(x, 2 * x)
    assert pcov.shape == (4, 4) and torch.isinf(pcov).all()


# -- strict load_state_dict ------------------------------------------------------------------
def _solver() -> LMA:
    prob = problem("rational")
    lma = LMA(prob.make_model(), ["cpu"], residual_fn, damping="nielsen", backend="numpy")
    lma.step(prob.x, prob.y)
    return lma


def _misspelt_top(state: dict[str, object]) -> dict[str, object]:
    changed = dict(state)
    changed["stpes"] = changed.pop("steps")
    return changed


def _missing_top(state: dict[str, object]) -> dict[str, object]:
    changed = dict(state)
    del changed["learning_rate"]
    return changed


def _extra_damping(state: dict[str, object]) -> dict[str, object]:
    inner = dict(state["damping_state"])  # type: ignore[call-overload]
    return dict(state, damping_state={**inner, "mu": 2.0})


def _misspelt_damping(state: dict[str, object]) -> dict[str, object]:
    inner = dict(state["damping_state"])  # type: ignore[call-overload]
    inner["nuu"] = inner.pop("nu")
    return dict(state, damping_state=inner)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_misspelt_top, r"missing keys \['steps'\], unexpected keys \['stpes'\]"),
        (_missing_top, r"missing keys \['learning_rate'\]"),
        (_extra_damping, r"unexpected keys \['mu'\]"),
        (_misspelt_damping, r"missing keys \['nu'\], unexpected keys \['nuu'\]"),
    ],
    ids=["misspelt key", "missing key", "unexpected damping key", "misspelt damping key"],
)
def test_load_state_dict_is_strict(edit: object, match: str) -> None:
    lma = _solver()
    before = lma.state_dict()
    other = _solver()
    other.step(problem("rational").x, problem("rational").y)
    with pytest.raises(SolverStateError, match=match + r".*HINT"):
        lma.load_state_dict(edit(other.state_dict()))  # type: ignore[operator]
    assert lma.state_dict() == before
