"""The shared least-squares problem suite for every solver backend.

Each :class:`Problem` is a tiny ``torch.nn.Module`` whose parameters are the unknowns,
with inputs ``x`` and targets ``y`` (residuals ``model(x) - y``), a standard starting
point, and where published, certified values. Everything is float64.

* ``linear``: ordinary linear least squares; one undamped step (λ ≈ 0, lr = 1) lands on
  the solution.
* ``rosenbrock``: r = (10(b₂ − b₁²), b₁ − 1) from (−1.2, 1); minimum 0 at (1, 1).
* ``exponential``: y = b₁·exp(−b₂x) + b₃ with noise.
* ``rational``: y = (b₁ + b₂x) / (1 + b₃x) with noise.
* NIST StRD nonlinear regression problems (https://www.itl.nist.gov/div898/strd/nls/),
  with NIST's data and certified values (``marquardt.testing.nist``): ``misra1a`` (lower
  difficulty) and ``mgh09`` (Kowalik-Osborne, higher difficulty) from start 1, ``mgh10``
  (Meyer, higher difficulty) from start 2 (start 1 is reached by no solver here, nor by
  MINPACK; see ``test_nist_strd``).

``scipy_reference(problem)`` runs ``scipy.optimize.least_squares(method="lm")`` (MINPACK)
from the same start with the exact Jacobian, for comparison of final costs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from marquardt.testing.nist import nist_problem

Curve = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class CurveModel(nn.Module):
    """y = f(b, x) with the unknowns b as one parameter vector."""

    def __init__(self, f: Curve, start: list[float]) -> None:
        super().__init__()
        self.f = f
        self.b = nn.Parameter(torch.tensor(start, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self.b, x)


@dataclass(frozen=True)
class Problem:
    """A least-squares problem: model factory at the start point, data, known answers."""

    name: str
    make_model: Callable[[], nn.Module]
    x: torch.Tensor
    y: torch.Tensor
    certified_params: list[float] | None = None
    certified_rss: float | None = None
    # Suggested solver settings (the NIST problems have badly scaled parameters).
    options: dict[str, object] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.y.numel())

    def params(self, model: nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()

    def rss(self, model: nn.Module) -> float:
        with torch.no_grad():
            r = (model(self.x) - self.y).reshape(-1)
        return float(r @ r)


def residual_fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a - b


def _column(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).unsqueeze(1)


def _curve(
    name: str, f: Curve, start: list[float], x: torch.Tensor, y: torch.Tensor, **kwargs: object
) -> Problem:
    return Problem(name, lambda: CurveModel(f, start), x, y, **kwargs)  # type: ignore[arg-type]


# -- linear ----------------------------------------------------------------------------------
def _linear() -> Problem:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(60, 4, generator=g, dtype=torch.float64)
    w = torch.tensor([[1.5], [-2.0], [0.5], [3.0]], dtype=torch.float64)
    y = x @ w + 0.7 + 0.05 * torch.randn(60, 1, generator=g, dtype=torch.float64)

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Linear(4, 1, dtype=torch.float64)

    return Problem("linear", make, x, y)


def linear_solution(problem: Problem) -> torch.Tensor:
    """The least-squares solution (weights then bias) of the linear problem."""
    design = torch.cat([problem.x, torch.ones(problem.rows, 1, dtype=torch.float64)], dim=1)
    return torch.linalg.lstsq(design, problem.y).solution.reshape(-1)


# -- curves ----------------------------------------------------------------------------------
def _rosenbrock(b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 0.5, 10.0 * (b[1] - b[0] ** 2), b[0])


def _exponential(b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return b[0] * torch.exp(-b[1] * x) + b[2]


def _rational(b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (b[0] + b[1] * x) / (1.0 + b[2] * x)


def _noisy(f: Curve, truth: list[float], x: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        clean = f(torch.tensor(truth, dtype=torch.float64), x)
    return clean + 0.01 * torch.randn(clean.shape, generator=g, dtype=torch.float64)


# NIST StRD problems: models, data and certified values from ``marquardt.testing.nist``
# (which holds all 27), the model called here as f(b, x).
_MISRA1A, _MGH09, _MGH10 = (nist_problem(n) for n in ("Misra1a", "MGH09", "MGH10"))


def unknowns_first(f: Callable[..., torch.Tensor]) -> Curve:
    """A NIST model f(x, b₁, …, b_k) as f(b, x), b one vector."""
    return lambda b, x: f(x, *b.unbind())


MISRA1A_X: list[float] = _MISRA1A.x.tolist()
MISRA1A_Y: list[float] = _MISRA1A.y.tolist()
MGH09_X: list[float] = _MGH09.x.tolist()
MGH09_Y: list[float] = _MGH09.y.tolist()
MGH10_X: list[float] = _MGH10.x.tolist()
MGH10_Y: list[float] = _MGH10.y.tolist()


def _noisy_curve(
    name: str, f: Curve, start: list[float], x: torch.Tensor, truth: list[float], seed: int
) -> Problem:
    """A curve fitted from ``start`` to its values at ``truth`` with noise (``_noisy``)."""
    return _curve(name, f, start, x, _noisy(f, truth, x, seed))


def _nist(name: str, nist: Any, start: int) -> Problem:
    """A NIST StRD problem from its ``start``-th starting point, with its certified values."""
    return _curve(
        name,
        unknowns_first(nist.f),
        list(nist.starts[start]),
        _column(nist.x.tolist()),
        _column(nist.y.tolist()),
        certified_params=list(nist.certified),
        certified_rss=nist.certified_rss,
    )


@functools.cache
def all_problems() -> tuple[Problem, ...]:
    x_exp = torch.linspace(0.0, 4.0, 40, dtype=torch.float64).unsqueeze(1)
    x_rat = torch.linspace(0.0, 3.0, 30, dtype=torch.float64).unsqueeze(1)
    return (
        _linear(),
        _curve(
            "rosenbrock",
            _rosenbrock,
            [-1.2, 1.0],
            _column([0.0, 1.0]),
            _column([0.0, 1.0]),
            certified_params=[1.0, 1.0],
            certified_rss=0.0,
        ),
        _noisy_curve("exponential", _exponential, [1.0, 0.5, 0.0], x_exp, [2.5, 1.3, 0.5], 1),
        _noisy_curve("rational", _rational, [0.5, 1.0, 0.1], x_rat, [1.0, 2.0, 0.5], 2),
        _nist("misra1a", _MISRA1A, 0),
        _nist("mgh09", _MGH09, 0),
        _nist("mgh10", _MGH10, 1),
    )


def problem(name: str) -> Problem:
    for p in all_problems():
        if p.name == name:
            return p
    raise KeyError(name)


PROBLEM_NAMES = tuple(p.name for p in all_problems())


@functools.cache
def scipy_reference(name: str) -> tuple[np.ndarray, float]:
    """(parameters, rss) of MINPACK's LM from the same start, exact Jacobian, tight tolerances."""
    from scipy.optimize import least_squares

    prob = problem(name)
    model = prob.make_model()
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    start = prob.params(model).numpy()

    def residuals_t(theta: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(theta, sizes)
        params = {n: c.view(s) for n, c, s in zip(names, chunks, shapes, strict=True)}
        out = torch.func.functional_call(model, params, (prob.x,))
        return (out - prob.y).reshape(-1)

    def fun(theta: np.ndarray) -> np.ndarray:
        return residuals_t(torch.from_numpy(theta)).detach().numpy()

    def jac(theta: np.ndarray) -> np.ndarray:
        return torch.autograd.functional.jacobian(residuals_t, torch.from_numpy(theta)).numpy()

    result = least_squares(
        fun, start, jac=jac, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=100_000
    )
    r = fun(result.x)
    return result.x, float(r @ r)


def run_to_convergence(lma: object, prob: Problem, max_steps: int = 2000) -> int:
    """Full-batch LM steps until the solver terminates; returns the number of steps."""
    for k in range(1, max_steps + 1):
        _, terminated = lma.step(prob.x, prob.y)  # type: ignore[attr-defined]
        if terminated:
            return k
    return max_steps


#: Backends every problem is solved with in the CPU test run; the Legate test module adds
#: "cupynumeric" by importing this suite.
CPU_BACKENDS = ("numpy", "torch")
DAMPINGS = ("fixed", "nielsen")
STRATEGIES = ("explicit", "accumulate")

# Settings for running a problem to tight convergence: a run ends when λ reaches its
# ceiling (no damped step lowers the loss any more); the step cap is a safety net.
SUITE_OPTIONS: dict[str, object] = {
    "damping_start": 1e-3,
    "damping_min": 1e-12,
    "damping_max": 1e10,
}
MAX_STEPS = 1500


def suite_lma(
    prob: Problem, model: nn.Module, *, backend: str, damping: str, strategy: str, **options: object
) -> Any:
    """The LMA of the suite over ``model`` (``prob``'s, at its start) on the CPU: the suite's
    settings, then the problem's own, then ``options``."""
    from marquardt.solver import LMA

    return LMA(
        model,
        [torch.device("cpu")],
        residual_fn,
        damping=damping,
        strategy=strategy,
        backend=backend,
        **{**SUITE_OPTIONS, **prob.options, **options},  # type: ignore[arg-type]
    )


def cpu_lma(prob: Problem, **options: object) -> tuple[Any, nn.Module]:
    """An LMA over a fresh model of ``prob`` (at its start) on the CPU, with ``options``.

    Returns (lma, model).
    """
    from marquardt.solver import LMA

    model = prob.make_model()
    return LMA(model, ["cpu"], residual_fn, **options), model  # type: ignore[arg-type]


def solve_problem(
    name: str, *, backend: str, damping: str, strategy: str, **options: object
) -> tuple[object, Problem, nn.Module, int]:
    """Run LMA on problem ``name`` from its start until it terminates.

    Returns (lma, problem, model, steps).
    """
    prob = problem(name)
    model = prob.make_model()
    lma = suite_lma(prob, model, backend=backend, damping=damping, strategy=strategy, **options)
    steps = run_to_convergence(lma, prob, MAX_STEPS)
    return lma, prob, model, steps


def assert_matches_scipy(name: str, *, backend: str, damping: str, strategy: str) -> float:
    """Solve ``name`` and check the final cost is within 1e-10 relative of MINPACK's LM
    from the same start, or lower; and, for certified problems, the certified RSS.

    Returns the final RSS.
    """
    _, prob, model, steps = solve_problem(name, backend=backend, damping=damping, strategy=strategy)
    rss = prob.rss(model)
    _, reference = scipy_reference(name)
    scale = max(reference, 1e-300)
    assert rss <= reference * (1 + 1e-10) + 1e-24, (
        f"{name} [{backend}/{damping}/{strategy}]: rss {rss!r} after {steps} steps, "
        f"MINPACK reached {reference!r}"
    )
    if prob.certified_rss is not None:
        assert rss <= max(prob.certified_rss, 0.0) * (1 + 1e-9) + 1e-24, (
            f"{name}: rss {rss!r}, certified {prob.certified_rss!r} (scale {scale:g})"
        )
    return rss
