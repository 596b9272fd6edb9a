"""The small-fit LM's digits: MINPACK's trust region (``_curve.single_lm.trust``) and its tests.

NIST's Hahn1 (a rational function with J's scaled condition number near 10⁷) and MGH10
(an exponential whose start 1 is far down a curved valley) from both certified starts,
through ``curve_fit`` (SciPy's default ``"lm"``: ``_curve.single_lm.minpack``) and through
``curve_fit_batch`` (the starts as one batch), at
tight tolerances must reach NIST's certified parameters to 6 significant digits or more
(``benchmarks/bench_nist.py`` fits all 27 problems); the damped step for a radius is
the damped least-squares solution; a rank-deficient J still gives SciPy's covariance.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from marquardt.solver import OptimizeWarning, curve_fit, curve_fit_batch
from marquardt.solver._curve.single_lm import trust
from marquardt.testing.nist import lre, nist_problem

TIGHT = {"ftol": 1e-15, "xtol": 1e-15, "gtol": 1e-15}


@pytest.mark.parametrize("name", ["Hahn1", "MGH10"])
@pytest.mark.parametrize("start", [1, 2])
def test_curve_fit_reaches_six_digits_at_tight_tolerances(name: str, start: int) -> None:
    problem = nist_problem(name)
    p0 = torch.tensor(problem.starts[start - 1], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        popt, _ = curve_fit(problem.f, problem.x, problem.y, p0, maxfev=100_000, **TIGHT)
    assert lre(popt, problem.certified) >= 6.0


@pytest.mark.parametrize(("name", "starts"), [("Hahn1", (1, 2)), ("MGH10", (1, 2))])
def test_curve_fit_batch_reaches_six_digits_at_tight_tolerances(
    name: str, starts: tuple[int, ...]
) -> None:
    """The batch of both starts (MGH10 from start 1 takes about 7,700 of the batch's
    damped steps: the slowest test of this module, some 7 s on two cores)."""
    problem = nist_problem(name)
    y = problem.y.expand(len(starts), -1).clone()
    p0 = torch.tensor([problem.starts[s - 1] for s in starts], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        popt, _ = curve_fit_batch(
            problem.f, problem.x, y, p0, max_nfev=100_000, compile=False, **TIGHT
        )
    assert min(lre(popt[k], problem.certified) for k in range(len(starts))) >= 6.0


@pytest.mark.parametrize("condition", [1e2, 1e7])
def test_the_step_for_a_radius_is_the_damped_least_squares_solution(condition: float) -> None:
    """Both routes (AᵀA's eigenvectors below ``GRAM_CONDITION``, R's SVD above): the step
    of length within 10% of Δ solves min ‖Az + r‖² + λ‖z‖², as the QR of [A; √λ·I] has it,
    and a radius longer than the Gauss-Newton step gives that step (λ = 0)."""
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.standard_normal((40, 4)))
    v, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    a = (u * np.logspace(0, -np.log10(condition), 4)) @ v.T
    d = np.array([1.0, 3.0, 0.5, 2.0])
    js = a * d  # A = J·D⁻¹
    r = rng.standard_normal(40)
    dec = trust.decompose(js, d, r, js.T @ r)
    newton = np.linalg.lstsq(a, -r, rcond=None)[0]
    step, lam = trust.step_for_radius(dec, 2.0 * float(np.linalg.norm(newton)), 0.0)
    assert lam == 0.0
    np.testing.assert_allclose(step, newton, rtol=1e-9 * condition)
    radius = 0.1 * float(np.linalg.norm(newton))
    step, lam = trust.step_for_radius(dec, radius, 0.0)
    assert lam > 0.0 and abs(np.linalg.norm(step) - radius) <= 0.1 * radius
    stacked = np.vstack([a, np.sqrt(lam) * np.eye(4)])
    damped = np.linalg.lstsq(stacked, -np.concatenate([r, np.zeros(4)]), rcond=None)[0]
    np.testing.assert_allclose(step, damped, rtol=1e-9, atol=1e-12 * np.linalg.norm(damped))


def test_a_torch_models_rank_deficient_jacobian_keeps_scipys_covariance() -> None:
    """a·x + 0·b: J's second column is zero, the continuation with autodiff's J is
    skipped, and pcov is SciPy's "lm" answer for the same model: inf, with its warning."""
    scipy_optimize = pytest.importorskip("scipy.optimize")
    x = np.linspace(0.0, 1.0, 20)
    y = 3.0 * x + 0.01 * np.sin(40 * x)

    def f(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * x + 0.0 * b

    with pytest.warns(OptimizeWarning, match="could not be estimated"):
        popt, pcov = curve_fit(f, torch.from_numpy(x), torch.from_numpy(y), [1.0, 1.0])
    with pytest.warns(scipy_optimize.OptimizeWarning, match="could not be estimated"):
        theirs = scipy_optimize.curve_fit(lambda x, a, b: a * x + 0.0 * b, x, y, [1.0, 1.0])
    assert torch.isinf(pcov).all() and np.isinf(theirs[1]).all()
    np.testing.assert_allclose(popt.numpy(), theirs[0], rtol=1e-7)


def test_stops_on_scipys_tests_where_scipy_stops() -> None:
    """At SciPy's defaults a NumPy model's fit stops on ftol (SciPy's status 2) no farther
    from the least-squares optimum than SciPy's own fit."""
    scipy_optimize = pytest.importorskip("scipy.optimize")
    x = np.linspace(0.0, 4.0, 50)
    rng = np.random.default_rng(7)
    y = 2.5 * np.exp(-1.3 * x) + 0.5 + 0.2 * rng.standard_normal(50)

    def f(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
        return a * np.exp(-b * x) + c

    ours = curve_fit(f, x, y, [1.0, 1.0, 0.0], full_output=True)
    theirs = scipy_optimize.curve_fit(f, x, y, [1.0, 1.0, 0.0])[0]
    best = scipy_optimize.least_squares(
        lambda p: f(x, *p) - y, [1.0, 1.0, 0.0], method="lm", **TIGHT
    ).x
    assert ours[4] == 2
    assert np.linalg.norm(ours[0] - best) <= 1.5 * np.linalg.norm(theirs - best)
