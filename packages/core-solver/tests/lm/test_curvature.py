"""Curvature from a subsample, the Nyström preconditioner and the matrix-free state:
the subsample's size rule, preconditioned CG against plain (Jacobi) CG on a known SPD
system with a decaying spectrum, and ``state_dict`` round trips."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from marquardt.solver import LMA, SolverConfigError, SolverStateError, TruncatedCG
from marquardt.solver._backends.base import LinearSystem
from marquardt.solver._lm.solve.cg import ConjugateGradients
from marquardt.solver._lm.solve.curvature import MIN_CURVATURE_SAMPLES, curvature_size, draw_samples
from marquardt.solver._lm.solve.preconditioners import nystrom_sketch


def test_the_subsample_size_follows_the_budget() -> None:
    # None: the step's products cost about two over the whole batch, floored, capped at N.
    assert curvature_size(None, 100_000, 40) == 5_000
    assert curvature_size(None, 20_000, 1_000) == MIN_CURVATURE_SAMPLES
    assert curvature_size(None, 300, 40) == 300
    assert curvature_size(0.25, 1_000, 40) == 250
    assert curvature_size(1.0, 1_000, 40) == 1_000
    assert curvature_size(64, 1_000, 40) == 64 and curvature_size(5_000, 1_000, 40) == 1_000
    # Capped where the engine forms J_S explicitly; an asked size is kept.
    assert curvature_size(None, 100_000, 40, explicit=300) == 300
    assert curvature_size(2_000, 100_000, 40, explicit=300) == 2_000
    gen = torch.Generator().manual_seed(0)
    index = draw_samples(1_000, 100, gen)
    assert index is not None and index.numel() == 100 and index.unique().numel() == 100
    assert draw_samples(1_000, 1_000, gen) is None  # every sample: exact products


@pytest.mark.parametrize(
    "options",
    [{"curvature_samples": 0.0}, {"curvature_samples": 0}, {"rank": 0}, {"preconditioner": "x"}],
)
def test_bad_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(SolverConfigError):
        TruncatedCG(**options)  # type: ignore[arg-type]


def _spd(params: int = 300, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A = Q diag(λᵢ) Qᵀ with λᵢ = i⁻², i = 1 … P, plus a rough diagonal; g random."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.linalg.qr(torch.randn(params, params, generator=gen, dtype=torch.float64)).Q
    values = torch.arange(1, params + 1, dtype=torch.float64).pow(-2.0)
    return q @ torch.diag(values) @ q.T, torch.randn(params, generator=gen, dtype=torch.float64)


def _solve(a: torch.Tensor, g: torch.Tensor, preconditioner: str, lam: float) -> tuple[int, str]:
    system = LinearSystem(
        a=lambda v: a @ v, g=g, diag=torch.diagonal(a).clone(), rows=10 * g.numel(),
        params=g.numel(), underdetermined=False, rss=1.0,
    )  # fmt: skip
    options = TruncatedCG(
        iterations=1_000, tolerance=1e-8, warm_start=0.0, preconditioner=preconditioner, rank=20
    )
    solution = ConjugateGradients(options, seed=3).solve(system, lam, "identity")
    exact = torch.linalg.solve(a + lam * torch.eye(g.numel(), dtype=a.dtype), g)
    residual = g - (a @ solution.delta + lam * solution.delta)
    assert float(residual.norm()) <= 1e-8 * float(g.norm())
    torch.testing.assert_close(
        solution.delta, exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max())
    )
    assert solution.iterations is not None
    return solution.iterations, solution.stop


def test_nystrom_preconditioned_cg_needs_fewer_iterations() -> None:
    a, g = _spd()
    lam = 1e-5
    plain, stop_plain = _solve(a, g, "jacobi", lam)
    nystrom, stop_nystrom = _solve(a, g, "nystrom", lam)
    assert stop_plain == stop_nystrom == "tolerance"
    assert nystrom < plain / 2, (nystrom, plain)


def test_the_sketch_recovers_a_low_rank_matrix() -> None:
    gen = torch.Generator().manual_seed(4)
    factor = torch.randn(50, 5, generator=gen, dtype=torch.float64)
    a = factor @ factor.T
    u, values = nystrom_sketch(lambda vs: vs @ a, 50, 8, gen, device=torch.device("cpu"))
    torch.testing.assert_close(u @ torch.diag(values) @ u.T, a, atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(values[:5], torch.linalg.eigvalsh(a).flip(0)[:5])


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1)).double()


def _data(n: int = 400) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 2 - 1
    return x, torch.sinc(3 * x)


def _lma(model: nn.Module) -> LMA:
    return LMA(
        model, ["cpu"], lambda a, b: a - b, strategy="matrix_free", seed=11,
        cg=TruncatedCG(iterations=5, curvature_samples=0.2, rank=4),
    )  # fmt: skip


def _theta(lma: LMA) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(lma.model.parameters()).detach().clone()


def test_the_state_survives_a_round_trip() -> None:
    """Save after two steps, load into a fresh LMA (and model), the next steps are
    identical: the same subsample, sketch and warm start."""
    x, y = _data()
    lma = _lma(_model())
    for _ in range(2):
        lma.step(x, y)
    assert lma.report is not None and lma.report.curvature_samples == 80
    state = copy.deepcopy(lma.state_dict())
    assert state["matrix_free"]["warm_start"] is not None
    fresh = _lma(_model(seed=5))
    fresh.model.load_state_dict(lma.model.state_dict())
    fresh.sync_replicas()
    fresh.load_state_dict(state)
    for _ in range(2):
        loss, _ = lma.step(x, y)
        loss_fresh, _ = fresh.step(x, y)
        assert loss_fresh == loss
        assert torch.equal(_theta(fresh), _theta(lma))
    # Without the state, the fresh solver draws other subsamples and starts cold.
    cold = _lma(_model(seed=5))
    cold.model.load_state_dict(fresh.model.state_dict())
    cold.sync_replicas()
    cold.step(x, y)
    lma.step(x, y)
    assert not torch.equal(_theta(cold), _theta(lma))


def test_a_dense_solver_saves_no_matrix_free_state_and_bad_ones_are_refused() -> None:
    x, y = _data(50)
    dense = LMA(_model(), ["cpu"], lambda a, b: a - b, strategy="accumulate")
    dense.step(x, y)
    assert "matrix_free" not in dense.state_dict()
    lma = _lma(_model())
    lma.step(x, y)
    state = lma.state_dict()
    bad = {**state, "matrix_free": {"warm_start": None}}
    before = copy.deepcopy(lma.state_dict())
    with pytest.raises(SolverStateError):
        lma.load_state_dict(bad)
    after = lma.state_dict()
    assert torch.equal(after["matrix_free"]["generator"], before["matrix_free"]["generator"])
