"""MINPACK-style ftol / xtol / gtol tests, off unless set."""

from __future__ import annotations

import numpy as np

from marquardt.solver import StoppingCriteria


def test_everything_off_by_default() -> None:
    s = StoppingCriteria()
    assert not s.ftol_met(1.0, 0.0, 0.0)
    assert not s.xtol_met(0.0, 1.0)
    assert not s.gtol_met(np.zeros(2), np.ones(2), 1.0, 4)


def test_ftol_needs_both_reductions_small() -> None:
    s = StoppingCriteria(ftol=1e-6)
    assert s.ftol_met(1.0, 5e-7, 5e-7)
    assert not s.ftol_met(1.0, 5e-7, 5e-6), "the prediction is still large"
    assert not s.ftol_met(1.0, 5e-6, 5e-7), "the actual reduction is still large"
    assert not s.ftol_met(1.0, 5e-7, 1e-7), "rho > 2 means the model is not trusted"


def test_xtol_relative_to_parameters() -> None:
    s = StoppingCriteria(xtol=1e-3)
    assert s.xtol_met(1e-4, 1.0)
    assert not s.xtol_met(1e-2, 1.0)


def test_gtol_is_the_cosine_between_residual_and_columns() -> None:
    rng = np.random.default_rng(0)
    jac = rng.normal(size=(20, 3))
    r = rng.normal(size=20)
    n = 20
    g = jac.T @ r / n
    diag = (jac * jac).sum(0) / n
    cosine = np.max(np.abs(jac.T @ r) / (np.linalg.norm(jac, axis=0) * np.linalg.norm(r)))
    assert StoppingCriteria(gtol=cosine * 1.001).gtol_met(g, diag, float(r @ r), n)
    assert not StoppingCriteria(gtol=cosine * 0.999).gtol_met(g, diag, float(r @ r), n)
    assert StoppingCriteria(gtol=0.0).gtol_met(g, diag, 0.0, n), "zero residual: done"
