"""The small-problem LM's rules (``_rules``): one set for the single fit, the batched fits
and `NielsenDamping`.

Each rule gives the same numbers on floats, NumPy arrays and torch tensors, one fit or a
batch; `NielsenDamping` moves λ by the same formula; and a single fit (SciPy's "lm":
MINPACK's trust region, ``_curve.single_lm.minpack``; "trf" with bounds or a robust loss: the
batch's own steps) and the same problem inside a batch reach the same minimum, to the
tolerances' reach, each stopping on a fit test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marquardt.solver import NielsenDamping, curve_fit, curve_fit_batch
from marquardt.solver import _rules as rules

RATIOS = [-0.5, 1e-9, 0.25, 0.5, 0.75, 1.0, 3.0]


def _kinds(values: list[float]) -> list[object]:
    return [np.array(values), torch.tensor(values, dtype=torch.float64)]


@pytest.mark.parametrize("ratio", RATIOS)
def test_nielsen_update_is_one_formula(ratio: float) -> None:
    expected = 2.0 * max(1.0 / 3.0, 1.0 - (2.0 * ratio - 1.0) ** 3)
    assert rules.nielsen_accept(2.0, ratio) == pytest.approx(expected, rel=1e-15)
    rule = NielsenDamping(2.0, minimum=1e-12, maximum=1e12)
    if ratio > 0:
        rule.on_accept(ratio, 1.0)
        assert rule.damping == pytest.approx(expected, rel=1e-15)
    for kind in _kinds([2.0, 2.0]):
        got = rules.nielsen_accept(kind, ratio + 0 * kind)
        np.testing.assert_allclose(np.asarray(got), [expected, expected], rtol=1e-15)
    lam, nu = rules.nielsen_reject(3.0, 4.0)
    rule = NielsenDamping(3.0, minimum=1e-12, maximum=1e12)
    rule.on_reject()
    rule.on_reject()
    assert (lam, nu) == (12.0, 8.0)
    assert rule.damping == 3.0 * 2.0 * 4.0 and rule.nu == 8.0


def test_rules_agree_across_array_kinds() -> None:
    rng = np.random.default_rng(3)
    js = rng.standard_normal((4, 7, 3))
    js[1, :, 2] = 0.0  # a zero column: D = 1 there
    p = rng.standard_normal((4, 3))
    step = 1e-3 * rng.standard_normal((4, 3))
    g = rng.standard_normal((4, 3))
    g[0] = [1.0, 1.0, -1.0]  # on its lower bound pushing out; on its upper pushing in
    lower, upper = p - np.array([0.0, 1.0, 1.0]), p + np.array([1.0, 0.0, 1.0])
    cost = np.array([1.0, 0.0, 2.0, 3.0])
    actual = np.array([1e-9, -1.0, 0.5, 0.1])
    predicted = np.array([1e-9, 0.0, 1.0, -1.0])

    def run(a: object) -> dict[str, object]:
        def cv(v: np.ndarray) -> object:
            return torch.from_numpy(v) if a is torch else v

        norms = rules.column_norms(cv(js))
        d = rules.start_scaling(norms)
        held = rules.held_at_bounds(cv(p), cv(lower), cv(upper), cv(g))
        ratio = rules.gain_ratio(cv(actual), cv(predicted))
        ftol = rules.ftol_met(cv(actual), cv(cost), ratio, 1e-8)
        xtol = rules.xtol_met(d, cv(step), cv(p), 1e-2)
        return {
            "norms": norms,
            "d": d,
            "lam": rules.start_damping(norms, d),
            "d2": rules.updated_scaling(d, 2.0 * norms),
            "held": held,
            "gtol": rules.gtol_met(cv(g), held, norms, cv(np.sqrt(2.0 * cost)), 0.5),
            "ratio": ratio,
            "ftol": ftol,
            "xtol": xtol,
            "status": rules.stop_status(ftol, xtol),
        }

    on_numpy, on_torch = run(np), run(torch)
    for name, value in on_numpy.items():
        np.testing.assert_allclose(
            np.asarray(on_torch[name]), np.asarray(value), rtol=1e-15, err_msg=name
        )
    assert on_numpy["d"][1, 2] == 1.0  # type: ignore[index]
    np.testing.assert_array_equal(on_numpy["ratio"], [1.0, -1.0, 0.5, 1.0])
    np.testing.assert_array_equal(on_numpy["held"][0], [True, False, False])  # type: ignore[index]
    assert on_numpy["gtol"][1]  # type: ignore[index]  # r = 0
    cosine = np.abs(g) / (np.sqrt(2.0 * cost)[:, None] * np.sqrt((js * js).sum(1)))
    for m in (0, 2, 3):
        free = ~on_numpy["held"][m]  # type: ignore[index]
        assert on_numpy["gtol"][m] == (cosine[m][free].max(initial=0.0) <= 0.5)  # type: ignore[index]
    # One fit at a time (floats and 1-D arrays) gives what the batch gives.
    for m in range(4):
        assert rules.gain_ratio(float(actual[m]), float(predicted[m])) == on_numpy["ratio"][m]  # type: ignore[index]
        one = rules.start_damping(rules.column_norms(js[m]), on_numpy["d"][m])  # type: ignore[index]
        assert float(one) == pytest.approx(float(on_numpy["lam"][m]), rel=1e-15)  # type: ignore[index]
        both = bool(on_numpy["ftol"][m]), bool(on_numpy["xtol"][m])  # type: ignore[index]
        if any(both):
            assert rules.stop_status(*both) == on_numpy["status"][m]  # type: ignore[index]


def test_robust_scaling_and_covariance_rules_agree_across_kinds() -> None:
    r = np.array([0.1, -2.0, 5.0])
    z = r**2
    first, second = 1.0 / np.sqrt(1.0 + z), -0.5 / (1.0 + z) ** 1.5
    scale_np, rs_np = rules.robust_scaling(r, z, first, second)
    scale_t, rs_t = rules.robust_scaling(*(torch.from_numpy(v) for v in (r, z, first, second)))
    np.testing.assert_allclose(scale_t.numpy(), scale_np, rtol=1e-15)
    np.testing.assert_allclose(rs_t.numpy(), rs_np, rtol=1e-15)
    assert np.all(scale_np >= np.sqrt(np.finfo(float).eps))  # clamped where ρ' + 2ρ''z < 0
    assert rules.covariance_scale(6.0, 5, 2) == 2.0
    assert rules.covariance_scale(6.0, 2, 2) == float("inf")
    batch = rules.covariance_scale(torch.tensor([6.0, 6.0]), torch.tensor([5.0, 2.0]), 2)
    assert batch.tolist() == [2.0, float("inf")]
    assert rules.singular_cut(2.0, 3, 5, 1e-16) == pytest.approx(1e-15)


def _decay(x: torch.Tensor, a: torch.Tensor, k: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return a * torch.exp(-k * x) + c


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"loss": "soft_l1", "f_scale": 0.1},
        {"bounds": ([0.0, 0.0, 0.3], [10.0, 10.0, 10.0])},
    ],
    ids=["linear", "soft_l1", "bound_active"],
)
def test_single_and_batched_fits_reach_the_same_minimum(options: dict[str, object]) -> None:
    """With SciPy's default tolerances both drivers stop on a fit test within the
    tolerances' reach of each other, and with tight ones nearer."""
    rng = np.random.default_rng(7)
    x = np.linspace(0.0, 4.0, 60)
    truth = np.array([[2.0, 1.3, 0.2], [1.0, 0.7, -0.2], [3.0, 2.0, 0.1]])
    y = truth[:, :1] * np.exp(-truth[:, 1:2] * x) + truth[:, 2:]
    y = y + 0.02 * rng.standard_normal(y.shape)
    p0 = np.array([1.0, 1.0, 0.5])
    tight = {"ftol": 1e-10, "xtol": 1e-10, "gtol": 1e-10}
    for tolerances in ({}, tight):
        popt_b, pcov_b, info = curve_fit_batch(
            _decay,
            torch.from_numpy(x),
            torch.from_numpy(y),
            torch.from_numpy(np.tile(p0, (3, 1))),
            full_output=True,
            **options,  # type: ignore[arg-type]
            **tolerances,  # type: ignore[arg-type]
        )
        for m in range(3):
            popt, pcov, _, _, ier = curve_fit(
                _decay, x, y[m], p0, full_output=True, **options, **tolerances
            )  # type: ignore[arg-type]
            assert 1 <= int(info["status"][m]) <= 4 and 1 <= ier <= 4
            if tolerances:
                # The batch's damped steps stop a little short on the bound-active fit (8e-6).
                np.testing.assert_allclose(popt_b[m].numpy(), popt, rtol=2e-5)
                scale = np.abs(pcov).max()
                np.testing.assert_allclose(pcov_b[m].numpy(), pcov, rtol=1e-4, atol=1e-8 * scale)
            else:
                # ftol = 1.5e-8 leaves the bound-active fit 1e-4 from its minimum.
                np.testing.assert_allclose(popt_b[m].numpy(), popt, rtol=5e-4)
