"""``Collocation``: batches of a ``PointResidual`` at points redrawn as training goes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from marquardt.jacobian import Collocation, PointResidual, ResidualGroup

F64 = torch.float64


def _value(u, x, y):  # type: ignore[no-untyped-def]
    return u(x) - y


def _height(u, x, _y):  # type: ignore[no-untyped-def]
    """A residual |r| = x₀ whatever the model: large at the right end of [0, 1]."""
    return x[0] + 0.0 * u(x)


def _residual() -> PointResidual:
    return PointResidual(ResidualGroup("pde", _height), ResidualGroup("data", _value))


def _uniform(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.rand(n, 1, generator=g, dtype=F64)


def _data(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, 1, generator=g, dtype=F64)
    return x, 2 * x[:, 0]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 1)).double()


SAMPLERS = {"pde": _uniform, "data": _data}


def test_a_draw_holds_every_group_with_its_targets() -> None:
    col = Collocation(_residual(), SAMPLERS, {"pde": 5, "data": 3})
    x, y = col.draw()
    assert x.shape == (8, 1)
    assert y[:, 0].tolist() == [0.0] * 5 + [1.0] * 3
    assert torch.equal(y[5:, 2], 2 * x[5:, 0])


def test_every_serves_one_draw_that_many_times_then_refreshes_a_fraction() -> None:
    col = Collocation(_residual(), SAMPLERS, {"pde": 8, "data": 4}, every=3, refresh=0.25)
    batches = [col.next_batch() for _ in range(4)]
    assert batches[0][0] is batches[1][0] is batches[2][0]
    changed = (batches[3][0] != batches[0][0]).any(1)
    assert int(changed[:8].sum()) == 2 and int(changed[8:].sum()) == 1
    assert col.draws == 2
    whole = Collocation(_residual(), SAMPLERS, {"pde": 8, "data": 4}, refresh=1.0)
    first, second = whole.next_batch()[0], whole.next_batch()[0]
    assert bool((first != second).all())


def test_the_same_seed_draws_the_same_points() -> None:
    a = Collocation(_residual(), SAMPLERS, {"pde": 4, "data": 2}, seed=5)
    b = Collocation(_residual(), SAMPLERS, {"pde": 4, "data": 2}, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.draw(), b.draw(), strict=True))


def test_residual_weighting_gathers_the_points_where_the_residual_is_large() -> None:
    model = _model()
    rows = {"pde": 2000, "data": 1}
    weighted = Collocation(_residual(), SAMPLERS, rows, power=2.0, floor=0.0, model=model)
    uniform = Collocation(_residual(), SAMPLERS, rows)
    # Kept with probability ∝ x² among uniform candidates: the kept points' mean moves
    # from 1/2 towards 3/4 (sampling without replacement from 4 candidates per point).
    assert float(uniform.draw()[0][:2000].mean()) == pytest.approx(0.5, abs=0.03)
    assert float(weighted.draw()[0][:2000].mean()) > 0.6


def test_a_data_loader_over_it_yields_its_batches() -> None:
    col = Collocation(_residual(), SAMPLERS, {"pde": 3, "data": 2}, refresh=1.0)
    loader = iter(DataLoader(col, batch_size=None))
    x1, _ = next(loader)
    x2, _ = next(loader)
    assert x1.shape == x2.shape == (5, 1) and not torch.equal(x1, x2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"samplers": {"pde": _uniform, "bc": _uniform}, "rows": {"pde": 1, "bc": 1}}, "'bc'"),
        ({"rows": {"pde": 3}}, "the same group names"),
        ({"rows": {"pde": 0, "data": 1}}, "rows"),
        ({"every": 0}, "every"),
        ({"refresh": 0.0}, "refresh"),
        ({"power": -1.0}, "power"),
        ({"power": 1.0}, "no model was given"),
    ],
)
def test_bad_settings_fail_before_any_draw(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    args = {"samplers": SAMPLERS, "rows": {"pde": 2, "data": 2}, **kwargs}
    with pytest.raises(ValueError, match=match):
        Collocation(_residual(), **args)


def test_a_sampler_that_ignores_n_is_named() -> None:
    def two(_n: int, _g: torch.Generator) -> torch.Tensor:
        return torch.zeros(2, 1, dtype=F64)

    col = Collocation(_residual(), {"pde": two}, {"pde": 5})
    with pytest.raises(ValueError, match="group 'pde' was asked for 5 points"):
        col.draw()
    with pytest.raises(TypeError, match="expects a PointResidual"):
        Collocation(lambda a, b: a - b, SAMPLERS, {"pde": 1, "data": 1})  # type: ignore[arg-type]
