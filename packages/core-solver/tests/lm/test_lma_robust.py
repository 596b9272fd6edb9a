"""LMA(robust_loss=..., f_scale=...): the robust cost of any model, by IRLS rows."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from problems import CurveModel, residual_fn, run_to_convergence, unknowns_first

from marquardt.solver import LMA, SolverConfigError
from marquardt.solver._lm.robust import rho
from marquardt.testing.curves import decay

_decay = unknowns_first(decay)  # y = b₁·exp(−b₂x) + b₃ as f(b, x), for CurveModel


X = torch.linspace(0.0, 4.0, 60, dtype=torch.float64).unsqueeze(1)
with torch.no_grad():
    Y = _decay(torch.tensor([2.5, 1.3, 0.5], dtype=torch.float64), X)
Y = Y + 0.02 * torch.randn(Y.shape, generator=torch.Generator().manual_seed(1), dtype=Y.dtype)
Y[::7] += 1.5  # outliers
START = [2.0, 1.0, 0.3]


class _Problem:
    x = X
    y = Y


def _lma(**options: object) -> tuple[LMA, CurveModel]:
    model = CurveModel(_decay, START)
    settings: dict[str, object] = {"damping_min": 1e-12, **options}
    return LMA(model, ["cpu"], residual_fn, **settings), model  # type: ignore[arg-type]


@pytest.mark.parametrize(("loss", "f_scale"), [("soft_l1", 0.1), ("huber", 0.5), ("cauchy", 1.0)])
def test_robust_lma_reaches_least_squares_optimum(loss: str, f_scale: float) -> None:
    from scipy.optimize import least_squares

    lma, model = _lma(robust_loss=loss, f_scale=f_scale)
    run_to_convergence(lma, _Problem(), 500)  # type: ignore[arg-type]
    x, y = X.numpy().ravel(), Y.numpy().ravel()

    def fun(b: np.ndarray) -> np.ndarray:
        return b[0] * np.exp(-b[1] * x) + b[2] - y

    def jac(b: np.ndarray) -> np.ndarray:
        e = np.exp(-b[1] * x)
        return np.stack([e, -b[0] * x * e, np.ones_like(x)], axis=1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = least_squares(
            fun, START, jac=jac, loss=loss, f_scale=f_scale, ftol=1e-15, xtol=1e-15, gtol=1e-15
        )
    np.testing.assert_allclose(model.b.detach().numpy(), ref.x, rtol=1e-6)
    # The loss LMA reports is the mean of c²ρ(z): 2·cost/N.
    with torch.no_grad():
        r = (model(X) - Y).reshape(-1)
    value, _, _ = rho(loss, (r / f_scale) ** 2)
    assert lma.report is not None
    assert lma.report.loss_after == pytest.approx(float((f_scale**2 * value).mean()), rel=1e-12)


def test_linear_robust_loss_takes_the_least_squares_steps() -> None:
    plain, plain_model = _lma()
    robust, robust_model = _lma(robust_loss="linear")
    for _ in range(5):
        loss_a, _ = plain.step(X, Y)
        loss_b, _ = robust.step(X, Y)
        assert loss_b == pytest.approx(loss_a, rel=1e-12)
    torch.testing.assert_close(robust_model.b, plain_model.b, rtol=1e-10, atol=0)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"robust_loss": "l1"}, "known ones"),
        ({"robust_loss": "huber", "f_scale": 0.0}, "f_scale"),
        ({"robust_loss": "huber", "loss_fn": lambda a, b: ((a - b) ** 2).mean()}, "both"),
    ],
    ids=["unknown name", "f_scale", "with loss_fn"],
)
def test_bad_robust_options(options: dict[str, object], match: str) -> None:
    with pytest.raises(SolverConfigError, match=match + r".*HINT"):
        _lma(**options)


def test_covariance_is_refused_for_a_robust_loss() -> None:
    lma, _ = _lma(robust_loss="huber")
    with pytest.raises(SolverConfigError, match="curve_fit"):
        lma.covariance(X, Y)
