"""What a problem of the PINN suite (``pinn_suite.py``) is: `Problem`, its network, and
the switchable remedies that make a variant of it (`with_built_in`, `with_causal_weights`,
`with_periodic`; time marching is ``pinn_marching.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from marquardt.jacobian import (
    CausalWeights,
    Collocation,
    HardBoundary,
    PeriodicFeatures,
    PointResidual,
    ResidualGroup,
)
from marquardt.testing.problems import tanh_mlp

Points = dict[str, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
Sampler = Callable[[int, torch.Generator], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
F64 = torch.float64


def tanh_network(inputs: int, width: int, depth: int, seed: int = 0) -> nn.Module:
    """``depth`` hidden tanh layers of ``width``, one output, float64, Xavier-normal weights
    (Glorot & Bengio 2010, as Raissi et al. 2019 initialise), zero biases."""
    net = tanh_mlp([inputs, *[width] * depth, 1], seed).double()
    for m in net:
        if isinstance(m, nn.Linear):
            nn.init.xavier_normal_(m.weight)
            nn.init.zeros_(m.bias)
    return net


class WithCoefficient(nn.Module):
    """A network ``u(x)`` beside one unknown coefficient of its equation, ``alpha`` (a
    parameter the fit moves with the weights; residuals read it as ``u.params["alpha"]``)."""

    def __init__(self, net: nn.Module, alpha: float) -> None:
        super().__init__()
        self.net = net
        self.alpha = nn.Parameter(torch.tensor(alpha, dtype=F64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


@dataclass(frozen=True)
class BuiltIn:
    """Dirichlet and initial conditions a `HardBoundary` makes exact: u = ``value`` + ``distance``·N,
    with ``distance`` zero where the conditions hold; the residual groups it makes needless."""

    distance: Callable[[torch.Tensor], torch.Tensor]
    value: Callable[[torch.Tensor], torch.Tensor] | None
    groups: tuple[str, ...]


@dataclass
class Problem:
    """One problem of the suite (``pinn_suite.py`` has the equations and sources).

    ``draw(generator)`` returns the keyword arguments of ``residual.batch`` for one set of
    collocation points (``rows`` per group); ``test_x`` / ``test_u`` are the reference;
    ``network()`` builds the model the benchmark trains; ``published`` lists
    ``(method, relative L2 error, source)`` where the literature gives one.
    """

    name: str
    residual: PointResidual
    sampler: Callable[[dict[str, int], torch.Generator], Points]
    rows: dict[str, int]
    test_x: torch.Tensor
    test_u: torch.Tensor
    width: int
    depth: int
    inputs: int = 2
    coefficient: float | None = None
    published: list[tuple[str, float, str]] = field(default_factory=list)
    #: The side conditions a `HardBoundary` can build in (None: none the suite builds in).
    built_in: BuiltIn | None = None
    #: Whether the last input is time on [0, 1] (what `CausalWeights` weighs by).
    in_time: bool = False
    #: Wraps the network (`with_built_in`'s `HardBoundary`); None: the plain network.
    wrap: Callable[[nn.Module], nn.Module] | None = None
    #: The period in the first input and the groups a periodic network makes needless
    #: (None: not periodic).
    periodic: tuple[float, tuple[str, ...]] | None = None
    #: Harmonics of `PeriodicFeatures` before the network (`with_periodic`; 0: none).
    harmonics: int = 0

    def draw(self, generator: torch.Generator, rows: dict[str, int] | None = None) -> Points:
        return self.sampler(rows or self.rows, generator)

    def batch(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return self.residual.batch(**self.draw(generator))

    def samplers(self) -> dict[str, Sampler]:
        """One ``sampler(n, generator)`` per group, for ``marquardt.jacobian.Collocation``."""

        def one(name: str) -> Sampler:
            return lambda n, g: self.sampler({**self.rows, name: n}, g)[name]

        return {name: one(name) for name in self.rows}

    def collocation(self, model: nn.Module | None = None, **options: Any) -> Collocation:
        """A ``Collocation`` of this problem's groups and rows (``options``: its keywords)."""
        return Collocation(self.residual, self.samplers(), self.rows, model=model, **options)

    def network(self, seed: int = 0) -> nn.Module:
        if self.harmonics and self.periodic is not None:
            features = PeriodicFeatures(self.inputs, 0, self.periodic[0], self.harmonics)
            width = 2 * self.harmonics + self.inputs - 1
            net = nn.Sequential(features, tanh_network(width, self.width, self.depth, seed))
        else:
            net = tanh_network(self.inputs, self.width, self.depth, seed)
        if self.wrap is not None:
            net = self.wrap(net)
        return net if self.coefficient is None else WithCoefficient(net, 1.0)

    def relative_l2(self, model: nn.Module) -> float:
        """‖u_θ − u‖₂ / ‖u‖₂ over the test points (for ``heat_inverse``: |α_θ − α| / α)."""
        if self.coefficient is not None:
            alpha = float(model.alpha.detach())  # type: ignore[operator]
            return abs(alpha - self.coefficient) / self.coefficient
        return self.field_error(model)

    def field_error(self, model: nn.Module) -> float:
        with torch.no_grad():
            u = model(self.test_x)[:, 0]
        return float((u - self.test_u).norm() / self.test_u.norm())


# -- the switchable remedies ----------------------------------------------------------------
def with_built_in(problem: Problem) -> Problem:
    """``problem`` with its side conditions built into the network (`HardBoundary`; Lagaris
    et al. 1998, Sukumar & Srivastava 2022) and the groups they make exact dropped."""
    built = problem.built_in
    if built is None:
        raise ValueError(f"the problem {problem.name!r} has no conditions the suite builds in")
    return _dropping(
        problem,
        built.groups,
        built_in=None,
        wrap=lambda net: HardBoundary(net, built.distance, built.value),
    )


def _dropping(problem: Problem, dropped: tuple[str, ...], **changes: Any) -> Problem:
    """``problem`` without the groups ``dropped`` (their rows no longer drawn)."""

    def sampler(rows: dict[str, int], g: torch.Generator) -> Points:
        points = problem.sampler({**problem.rows, **rows}, g)
        return {k: v for k, v in points.items() if k not in dropped}

    return dataclasses.replace(
        problem,
        residual=PointResidual(*(g for g in problem.residual.groups if g.name not in dropped)),
        sampler=sampler,
        rows={k: n for k, n in problem.rows.items() if k not in dropped},
        **changes,
    )


def with_periodic(problem: Problem, harmonics: int = 8) -> Problem:
    """``problem`` on a network periodic in x by construction (`PeriodicFeatures` of
    ``harmonics`` harmonics first; Dong & Ni 2021), its periodic rows dropped."""
    if problem.periodic is None:
        raise ValueError(f"the problem {problem.name!r} is not periodic")
    return _dropping(problem, problem.periodic[1], harmonics=harmonics)


def with_causal_weights(
    problem: Problem, bins: int = 32, epsilon: float = 1.0
) -> tuple[Problem, CausalWeights]:
    """``problem`` with its equation's rows weighed by time bin (`CausalWeights`; Wang,
    Sankaran & Perdikaris 2022), and the weights to update before each step."""
    if not problem.in_time:
        raise ValueError(f"the problem {problem.name!r} has no time to weigh causally")
    causal = CausalWeights((0.0, 1.0), bins=bins, epsilon=epsilon)
    groups = (
        ResidualGroup(g.name, causal.weigh(g.fn), g.weight) if g.name == "pde" else g
        for g in problem.residual.groups
    )
    return dataclasses.replace(problem, residual=PointResidual(*groups)), causal
