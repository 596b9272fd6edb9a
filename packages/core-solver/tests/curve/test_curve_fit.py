"""curve_fit_result (the sliced engine) against scipy.optimize.curve_fit: uncertainties,
results and bad input.

SciPy's reference is MINPACK's LM with the exact Jacobian and tolerances at 1e-15
(``curve_problems.scipy_reference``). popt agrees within 1e-8 relative; pcov within 1e-6
of √(pcov_ii·pcov_jj) for every entry (an off-diagonal entry near zero has no relative
accuracy of its own) and within 1e-6 relative on the diagonal.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from curve_problems import CURVE_NAMES, curve_problem, numpy_model, scipy_reference

from marquardt.solver import (
    CovarianceWarning,
    CurveFitInputError,
    CurveFitResult,
    OptimizeWarning,
    curve_fit_result,
)
from marquardt.solver._curve.large import active_set as _active_set
from marquardt.testing.curves import popt_pcov

WEIGHTINGS = ("none", "sigma", "absolute")
#: Ill-conditioned NIST problems whose optimum float64 pins down to fewer digits.
HARD = ("mgh09",)
MGH09_CERTIFIED = [1.9280693458e-01, 1.9128232873e-01, 1.2305650693e-01, 1.3606233068e-01]


def _fit(name: str, weighting: str, **options: object) -> CurveFitResult:
    prob = curve_problem(name)
    kwargs: dict[str, object] = {}
    if weighting != "none":
        kwargs["sigma"] = prob.sigma
        kwargs["absolute_sigma"] = weighting == "absolute"
    result = curve_fit_result(prob.f, prob.x, prob.y, prob.p0, **kwargs, **options)
    assert isinstance(result, CurveFitResult)
    return result


def assert_pcov_close(ours: np.ndarray, ref: np.ndarray, rtol: float) -> None:
    scale = np.sqrt(np.outer(np.diag(ref), np.diag(ref)))
    worst = float(np.max(np.abs(ours - ref) / scale))
    assert worst <= rtol, f"pcov differs by {worst:.2e} of √(pcov_ii·pcov_jj)"
    np.testing.assert_allclose(np.diag(ours), np.diag(ref), rtol=rtol)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("name", [n for n in CURVE_NAMES if n not in HARD])
def test_matches_scipy(name: str, weighting: str) -> None:
    popt_ref, pcov_ref = scipy_reference(name, weighting)
    result = _fit(name, weighting)
    assert result.success, result.reason
    np.testing.assert_allclose(result.popt.numpy(), popt_ref, rtol=1e-8, atol=0)
    assert_pcov_close(result.pcov.numpy(), pcov_ref, 1e-6)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_mgh09_to_the_digits_float64_holds(weighting: str) -> None:
    """MGH09 (NIST, higher difficulty) is ill-conditioned: both fits agree to ~3e-8."""
    popt_ref, pcov_ref = scipy_reference("mgh09", weighting)
    result = _fit("mgh09", weighting)
    np.testing.assert_allclose(result.popt.numpy(), popt_ref, rtol=1e-7, atol=0)
    assert_pcov_close(result.pcov.numpy(), pcov_ref, 1e-6)
    if weighting == "none":
        # Log relative error ≥ 7.5 against NIST's certified values.
        np.testing.assert_allclose(result.popt.numpy(), MGH09_CERTIFIED, rtol=3e-8, atol=0)


def test_plain_call_returns_popt_and_pcov() -> None:
    prob = curve_problem("exp_decay")
    popt, pcov = popt_pcov(prob.f, prob.x, prob.y, prob.p0)
    assert popt.shape == (3,) and pcov.shape == (3, 3)
    assert popt.dtype == torch.float64 and popt.device.type == "cpu"
    torch.testing.assert_close(pcov, pcov.T, rtol=0, atol=0)


def test_full_output_describes_the_fit() -> None:
    prob = curve_problem("gaussian")
    result = _fit("gaussian", "sigma")
    model = numpy_model(prob.f)
    expected = (model(prob.x, *result.popt.tolist()) - prob.y) / prob.sigma
    np.testing.assert_allclose(result.residuals.numpy(), expected, rtol=1e-12, atol=1e-12)
    assert result.cost == pytest.approx(0.5 * float(expected @ expected), rel=1e-12)
    assert result.jacobian_rank == 4 and result.singular_values.shape == (4,)
    torch.testing.assert_close(result.perr, torch.sqrt(torch.diagonal(result.pcov)))
    assert result.termination is not None and result.report is not None
    assert 1 <= result.steps < 100


def test_sigma_scale_does_not_change_relative_covariance() -> None:
    """absolute_sigma=False: pcov is invariant to σ → kσ; with True it scales by k²."""
    prob = curve_problem("rational")
    _, pcov = popt_pcov(prob.f, prob.x, prob.y, prob.p0, sigma=prob.sigma)
    _, pcov_k = popt_pcov(prob.f, prob.x, prob.y, prob.p0, sigma=3.0 * prob.sigma)
    torch.testing.assert_close(pcov_k, pcov, rtol=1e-7, atol=0)
    _, abs1 = popt_pcov(prob.f, prob.x, prob.y, prob.p0, sigma=prob.sigma, absolute_sigma=True)
    _, abs3 = popt_pcov(
        prob.f, prob.x, prob.y, prob.p0, sigma=3.0 * prob.sigma, absolute_sigma=True
    )
    torch.testing.assert_close(abs3, 9.0 * abs1, rtol=1e-7, atol=0)


def test_slices_give_the_same_fit() -> None:
    whole = _fit("damped_sine", "sigma")
    sliced = _fit("damped_sine", "sigma", slice_size=17)
    torch.testing.assert_close(sliced.popt, whole.popt, rtol=1e-10, atol=0)
    torch.testing.assert_close(sliced.pcov, whole.pcov, rtol=1e-8, atol=0)


def test_many_slices_keep_the_factor_for_the_last_digits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over more than one slice of the final pass, the last Gauss-Newton correction is
    checked with a forward pass only and J's factor is kept: popt, pcov, residuals and cost
    still match SciPy's tight fit and the data at popt."""
    from scipy.optimize import least_squares

    from marquardt.solver._curve.large import point as _curve_point

    n = 3 * (1 << 16) + 11
    rng = np.random.default_rng(7)
    x = np.linspace(-5.0, 5.0, n)
    sigma = 0.05 + 0.02 * rng.random(n)
    truth = (2.0, 0.3, 0.8, 0.5)

    def gaussian(xs: np.ndarray, a: float, mu: float, s: float, c: float) -> np.ndarray:
        return a * np.exp(-0.5 * ((xs - mu) / s) ** 2) + c

    y = gaussian(x, *truth) + sigma * rng.standard_normal(n)

    def residuals(p: np.ndarray) -> np.ndarray:
        return (gaussian(x, *p) - y) / sigma

    def jacobian(p: np.ndarray) -> np.ndarray:
        a, mu, s, _ = p
        z = (x - mu) / s
        e = np.exp(-0.5 * z * z)
        return np.stack([e, a * e * z / s, a * e * z * z / s, np.ones_like(x)], 1) / sigma[:, None]

    ref = least_squares(
        residuals,
        [1.0, 0.0, 1.0, 0.0],
        jac=jacobian,
        method="lm",
        ftol=1e-15,
        xtol=1e-15,
        gtol=1e-15,
    )
    jac = jacobian(ref.x)
    pcov_ref = np.linalg.inv(jac.T @ jac) * (2 * ref.cost / (n - 4))
    factored: list[torch.Tensor] = []
    forward_only: list[torch.Tensor] = []
    real_at, real_residuals = _curve_point.PointPasses.at, _curve_point.PointPasses.residuals

    def at(self: _curve_point.PointPasses, params: torch.Tensor) -> _curve_point.AtPoint:
        factored.append(params.clone())
        return real_at(self, params)

    def residuals_only(
        self: _curve_point.PointPasses, params: torch.Tensor
    ) -> _curve_point.Residuals:
        forward_only.append(params.clone())
        return real_residuals(self, params)

    monkeypatch.setattr(_curve_point.PointPasses, "at", at)
    monkeypatch.setattr(_curve_point.PointPasses, "residuals", residuals_only)

    def f(
        xs: torch.Tensor, a: torch.Tensor, mu: torch.Tensor, s: torch.Tensor, c: torch.Tensor
    ) -> torch.Tensor:
        return a * torch.exp(-0.5 * ((xs - mu) / s) ** 2) + c

    result = curve_fit_result(
        f,
        torch.from_numpy(x),
        torch.from_numpy(y),
        [1.0, 0.0, 1.0, 0.0],
        sigma=torch.from_numpy(sigma),
    )
    # popt is a point reached by a correction checked with a forward pass alone: r was
    # evaluated there, J never was.
    assert any(torch.equal(result.popt, q) for q in forward_only)
    assert not any(torch.equal(result.popt, q) for q in factored)
    np.testing.assert_allclose(result.popt.numpy(), ref.x, rtol=1e-8, atol=0)
    assert_pcov_close(result.pcov.numpy(), pcov_ref, 1e-6)
    expected = residuals(result.popt.numpy())
    np.testing.assert_allclose(result.residuals.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert result.cost == pytest.approx(0.5 * float(expected @ expected), rel=1e-12)


def test_lm_hands_over_to_gauss_newton_near_the_optimum() -> None:
    """LM stops after an accepted step that lowered the cost by ≤ 1e-6 relative with its
    model holding, and Gauss-Newton corrections finish: the same popt and pcov as SciPy."""
    popt_ref, pcov_ref = scipy_reference("gaussian", "sigma")
    result = _fit("gaussian", "sigma")
    assert result.success and result.termination == "gauss-newton", result.reason
    assert result.report is not None and result.report.accepted
    np.testing.assert_allclose(result.popt.numpy(), popt_ref, rtol=1e-8, atol=0)
    assert_pcov_close(result.pcov.numpy(), pcov_ref, 1e-6)


def test_lm_goes_on_when_gauss_newton_cannot_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no Gauss-Newton correction allowed, LM resumes from where it handed over and
    terminates by its own tests, at the same optimum."""
    from marquardt.solver._curve.large import point as _curve_point

    handed = _fit("gaussian", "sigma")
    monkeypatch.setattr(_curve_point, "REFINE_LIMIT", 0.0)
    popt_ref, _ = scipy_reference("gaussian", "sigma")
    result = _fit("gaussian", "sigma")
    assert result.success and result.termination not in (None, "gauss-newton")
    assert result.steps > handed.steps
    np.testing.assert_allclose(result.popt.numpy(), popt_ref, rtol=1e-8, atol=0)


def test_rank_deficient_jacobian_gives_inf_and_a_warning() -> None:
    x = np.linspace(0.0, 1.0, 20)
    y = 3.0 * x

    def f(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a + b) * x

    with pytest.warns(CovarianceWarning, match=r"rank 1 < 2.*HINT"):
        result = curve_fit_result(f, x, y, [1.0, 1.0])
    assert result.jacobian_rank == 1
    assert torch.isinf(result.pcov).all()
    assert float(result.popt.sum()) == pytest.approx(3.0, rel=1e-10)


def test_as_many_points_as_parameters_gives_inf_unless_absolute() -> None:
    x, y = np.array([0.0, 1.0]), np.array([1.0, 3.0])

    def line(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b * x

    with pytest.warns(CovarianceWarning, match="N ≤ P"):
        popt, pcov = popt_pcov(line, x, y, [0.0, 0.0])
    assert torch.isinf(pcov).all()
    torch.testing.assert_close(popt, torch.tensor([1.0, 2.0], dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, pcov_abs = popt_pcov(line, x, y, [0.0, 0.0], sigma=[1.0, 1.0], absolute_sigma=True)
    # (XᵀX)⁻¹ for X = [[1, 0], [1, 1]].
    torch.testing.assert_close(pcov_abs, torch.tensor([[1.0, -1.0], [-1.0, 2.0]]).double())


def test_max_steps_is_a_result_with_a_warning() -> None:
    prob = curve_problem("misra1a")
    with pytest.warns(OptimizeWarning, match="max_steps=2"):
        result = curve_fit_result(prob.f, prob.x, prob.y, prob.p0, max_steps=2)
    assert not result.success and result.steps == 2


def test_p0_from_the_signature() -> None:
    x = np.linspace(0, 1, 10)

    def line(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b * x

    popt, _ = popt_pcov(line, x, 2.0 + 0.5 * x)
    torch.testing.assert_close(popt, torch.tensor([2.0, 0.5], dtype=torch.float64))


def test_float32_fit_lands_near_the_float64_one() -> None:
    prob = curve_problem("exp_decay")
    popt64, _ = popt_pcov(prob.f, prob.x, prob.y, prob.p0)
    popt32, _ = popt_pcov(prob.f, prob.x, prob.y, prob.p0, dtype=torch.float32)
    torch.testing.assert_close(popt32, popt64, rtol=1e-4, atol=0)


# -- bad input: a clear error before any work -----------------------------------------------
def _line(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b * x


X = np.linspace(0.0, 1.0, 8)
Y = 1.0 + 2.0 * X
NAN_Y = Y.copy()
NAN_Y[3] = math.nan

BAD_INPUTS = [
    ("ydata 2-D", dict(ydata=Y.reshape(2, 4)), "1-D array"),
    ("xdata length", dict(xdata=X[:-1]), r"shape \(N,\) or \(k, N\) with N = 8"),
    ("xdata samples first", dict(xdata=np.stack([X, X], axis=1)), "last axis"),
    ("p0 too short", dict(p0=[1.0]), "it raised TypeError"),
    ("p0 2-D", dict(p0=[[1.0, 2.0]]), "1-D sequence"),
    ("p0 outside bounds", dict(p0=[5.0, 1.0], bounds=([0, 0], [2, 2])), r"p0 within the bounds"),
    ("lower ≥ upper", dict(bounds=([0, 3], [2, 3])), r"lower ≥ upper for parameter\(s\) \[1\]"),
    ("bounds length", dict(bounds=([0, 0, 0], [1, 1, 1])), "one number or 2 values"),
    ("bounds not a pair", dict(bounds=[0.0]), r"pair \(lower, upper\)"),
    ("NaN ydata", dict(ydata=NAN_Y), "ydata contain 1 NaN/inf"),
    ("NaN xdata", dict(xdata=np.where(X > 0.5, math.nan, X)), "finite xdata"),
    ("sigma length", dict(sigma=np.ones(3)), "1-D array of 8 standard deviations"),
    ("sigma 2-D", dict(sigma=np.eye(8)), "whiten"),
    ("sigma zero", dict(sigma=np.zeros(8)), "sigma > 0"),
    ("loss", dict(loss="l2"), "known losses"),
    ("f_scale", dict(f_scale=0.0), "f_scale > 0"),
    ("f wrong shape", dict(f=lambda x, a, b: (a + b * x).sum()), r"shape \(8,\) for 8 points"),
    ("f numpy", dict(f=lambda x, a, b: np.asarray(x)), "torch.Tensor"),
    ("f NaN at p0", dict(f=lambda x, a, b: torch.log(a - 5.0) + b * x), "finite"),
    ("f not callable", dict(f=3.0), "callable"),
    ("dtype", dict(dtype=torch.int64), "floating torch.dtype"),
]


@pytest.mark.parametrize(
    ("changes", "match"), [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_is_refused_before_any_work(
    changes: dict[str, object], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_solver(*args: object, **kwargs: object) -> None:
        raise AssertionError("an LMA was built for bad input")

    monkeypatch.setattr(_active_set, "LMA", no_solver)
    args: dict[str, object] = dict(f=_line, xdata=X, ydata=Y, p0=[1.0, 1.0])
    args.update(changes)
    with pytest.raises(CurveFitInputError, match=match) as info:
        popt_pcov(**args)  # type: ignore[arg-type]
    assert "HINT:" in str(info.value)


def test_max_steps_must_be_positive() -> None:
    with pytest.raises(CurveFitInputError, match="max_steps"):
        popt_pcov(_line, X, Y, [1.0, 1.0], max_steps=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["gaussian", "surface_2d", "misra1a"])
def test_cuda_matches_cpu(name: str) -> None:
    prob = curve_problem(name)
    cpu = curve_fit_result(prob.f, prob.x, prob.y, prob.p0, sigma=prob.sigma)
    gpu = curve_fit_result(prob.f, prob.x, prob.y, prob.p0, sigma=prob.sigma, device="cuda")
    torch.testing.assert_close(gpu.popt, cpu.popt, rtol=1e-10, atol=0)
    torch.testing.assert_close(gpu.pcov, cpu.pcov, rtol=1e-10, atol=1e-300)


def _blocks(m: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [m[lo : lo + size] for lo in range(0, m.shape[0], size)]


def test_gram_factor_matches_the_qr_one_when_well_conditioned() -> None:
    """RᵀR from the Gram matrix equals MᵀM and R equals QR's R up to the rows' signs."""
    from marquardt.solver._lm.covariance import GramFactor, TriangularFactor

    gen = torch.Generator().manual_seed(3)
    m = torch.randn(10_000, 5, generator=gen, dtype=torch.float64) * torch.tensor(
        [1e-3, 1.0, 1e3, 5.0, 1e6], dtype=torch.float64
    )
    gram, qr = GramFactor(), TriangularFactor()
    for block in _blocks(m, 3_000):
        gram.add(block.T)
        qr.add(block)
    factor = gram.factor(1e4)
    assert factor is not None and gram.rows == qr.rows == 10_000
    assert qr.factor is not None
    signs = torch.sign(torch.diagonal(qr.factor)).unsqueeze(1)
    torch.testing.assert_close(factor, signs * qr.factor, rtol=1e-10, atol=1e-12 * 1e6)


def test_gram_factor_declines_an_ill_conditioned_matrix() -> None:
    """Columns 1, x, …, x⁷ on [0, 1] (κ ≈ 7.7·10⁴ after scaling): ε·κ² is too coarse, so
    the Gram route says None and the caller falls back to QR; a zero column is declined."""
    from marquardt.solver._lm.covariance import GramFactor

    x = torch.linspace(0.0, 1.0, 5_000, dtype=torch.float64)
    vandermonde = torch.stack([x**k for k in range(8)], dim=1)
    gram = GramFactor()
    gram.add(vandermonde.T)
    assert gram.factor(1e4) is None
    assert gram.factor(1e12) is not None
    zero = GramFactor()
    zero.add(torch.cat([vandermonde[:, :2], torch.zeros(5_000, 1, dtype=torch.float64)], 1).T)
    assert zero.factor(1e4) is None


def test_an_ill_conditioned_fit_takes_the_qr_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """A degree-7 polynomial on [0, 1] (scaled κ ≈ 7.7·10⁴): the final pass falls back to
    QR, and popt and pcov are the least-squares ones to the accuracy κ allows."""
    from marquardt.solver._curve.large import point as _curve_point

    routes: list[str] = []
    real = _curve_point.TriangularFactor.add

    def spy(self: _curve_point.TriangularFactor, block: torch.Tensor) -> None:
        routes.append("qr")
        real(self, block)

    monkeypatch.setattr(_curve_point.TriangularFactor, "add", spy)
    rng = np.random.default_rng(11)
    x = np.linspace(0.0, 1.0, 5_000)
    truth = np.array([1.0, -2.0, 3.0, 0.5, -1.0, 2.0, -0.7, 0.3])
    vandermonde = np.stack([x**k for k in range(8)], axis=1)
    y = vandermonde @ truth + 0.01 * rng.standard_normal(x.size)

    def poly(xs: torch.Tensor, *c: torch.Tensor) -> torch.Tensor:
        return sum((ck * xs**k for k, ck in enumerate(c)), torch.zeros_like(xs))

    popt, pcov = popt_pcov(poly, torch.from_numpy(x), torch.from_numpy(y), [0.0] * 8)
    assert routes, "the QR route was not taken"
    best, *_ = np.linalg.lstsq(vandermonde, y, rcond=None)
    np.testing.assert_allclose(popt.numpy(), best, rtol=1e-7, atol=0)
    residual = vandermonde @ best - y
    r = np.linalg.qr(vandermonde, mode="r")
    inverse = np.linalg.inv(r)
    expected = inverse @ inverse.T * float(residual @ residual) / (x.size - 8)
    assert_pcov_close(pcov.numpy(), expected, 1e-6)
