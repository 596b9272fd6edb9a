"""The PINN problem suite: six problems from the literature, each with its residual groups,
a way to draw collocation points, a reference solution and a relative L2 error.

Every problem is a :class:`Problem` (``pinn_problem.py``): a ``PointResidual`` whose
groups are the equation and its side conditions, ``draw(rows, generator)`` (the keyword arguments of
``PointResidual.batch`` for fresh collocation points), a tanh network of the size the
benchmark trains, test points with the reference there, and published figures where the
literature gives them. References are exact where a closed form exists, else computed
here (``pinn_references.py``, never downloaded):

* ``poisson``: −Δu = 2π² sin(πx) sin(πy) on [0, 1]², u = 0 on the boundary; exact
  u = sin(πx) sin(πy) (the first example of Müller & Zeinhofer 2023, "Achieving high
  accuracy with PINNs via energy natural gradient descent", ICML).
* ``helmholtz``: Δu + k²u = q on [−1, 1]², u = 0 on the boundary, k = 1, a₁ = 1, a₂ = 4;
  exact u = sin(a₁πx) sin(a₂πy) (Wang, Teng & Perdikaris 2021, "Understanding and
  mitigating gradient flow pathologies in physics-informed neural networks", SIAM J. Sci.
  Comput. 43, §2.3).
* ``burgers``: u_t + u u_x = ν u_xx on [−1, 1] × [0, 1], ν = 0.01/π, u(x, 0) = −sin(πx),
  u(±1, t) = 0 (Raissi, Perdikaris & Karniadakis 2019, J. Comput. Phys. 378, §3.1), on
  8,000 equation points (the paper's 10⁴ is the scale the shock needs);
  reference: the Cole–Hopf solution, its two integrals by Gauss–Hermite quadrature
  (Basdevant et al. 1986, Computers & Fluids 14).
* ``allen_cahn``: u_t − 10⁻⁴ u_xx + 5u³ − 5u = 0 on [−1, 1] × [0, 1], u(x, 0) = x² cos(πx),
  periodic in x (Raissi et al. 2019, §4.2); reference: a Fourier spectral solution
  stepped by ETDRK4 (Cox & Matthews 2002; Kassam & Trefethen 2005, SIAM J. Sci. Comput.
  26, whose contour-integral evaluation of the coefficients is used).
* ``heat``: u_t = α u_xx on [0, 1] × [0, 1], α = 0.4, u(x, 0) = sin(πx), u(0, t) =
  u(1, t) = 0; exact u = e^{−απ²t} sin(πx) (the heat example of DeepXDE, Lu et al. 2021,
  SIAM Review 63).
* ``heat_inverse``: the same equation with α unknown, recovered with u from noise-free
  values of u at scattered points (the data-driven discovery of Raissi et al. 2019, §4);
  α is a parameter of the model (:class:`WithCoefficient`), the error is α's relative error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from pinn_problem import (
    F64,
    BuiltIn,
    Points,
    Problem,
    WithCoefficient,
    tanh_network,
    with_built_in,
    with_causal_weights,
    with_periodic,
)
from pinn_references import (
    AC_D,
    AC_GAMMA,
    BURGERS_NU,
    allen_cahn_reference,
    burgers_cole_hopf,
)

from marquardt.jacobian import PointResidual, ResidualGroup

__all__ = [
    "LARGE",
    "NAMED",
    "PROBLEMS",
    "Problem",
    "WithCoefficient",
    "helmholtz_wide",
    "problem",
    "tanh_network",
    "with_built_in",
    "with_causal_weights",
    "with_periodic",
]


# -- sampling helpers -------------------------------------------------------------------
def _uniform(n: int, lo: list[float], hi: list[float], g: torch.Generator) -> torch.Tensor:
    a, b = torch.tensor(lo, dtype=F64), torch.tensor(hi, dtype=F64)
    return a + (b - a) * torch.rand(n, len(lo), generator=g, dtype=F64)


def _square_edge(n: int, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    """``n`` points on the boundary of [lo, hi]², uniformly over its four sides."""
    s = lo + (hi - lo) * torch.rand(n, generator=g, dtype=F64)
    side = torch.randint(0, 4, (n,), generator=g)
    fixed = torch.where(side % 2 == 0, torch.full_like(s, lo), torch.full_like(s, hi))
    return torch.where((side < 2)[:, None], torch.stack([s, fixed], 1), torch.stack([fixed, s], 1))


# -- derivatives at one point -------------------------------------------------------------
def _laplacian(u: Any, x: torch.Tensor) -> torch.Tensor:
    return u.laplacian(x)


def _space_time(u: Any, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(u_x, u_t, u_xx) at a point p = (x, t)."""
    grad = u.grad(p)
    return grad[0], grad[1], u.hessian_diagonal(p)[0]


def _line_in_time(
    span: tuple[float, float],
    initial: Callable[[torch.Tensor], torch.Tensor],
    sides: tuple[float, float],
) -> Callable[[dict[str, int], torch.Generator], Points]:
    """Points of a 1-D problem in time on ``span`` × [0, 1]: the interior, the initial line
    with its values ``initial(x)``, and the two ends, each boundary point at ``sides[0]``
    or ``sides[1]`` with probability ½."""
    lo, hi = span

    def sampler(rows: dict[str, int], g: torch.Generator) -> Points:
        x0 = _uniform(rows["initial"], [lo], [hi], g)
        tb = _uniform(rows["boundary"], [0], [1], g)
        coin = torch.rand(rows["boundary"], 1, generator=g) < 0.5
        side = torch.where(coin, sides[0], sides[1]).to(F64)
        return {
            "pde": _uniform(rows["pde"], [lo, 0], [hi, 1], g),
            "initial": (torch.cat([x0, torch.zeros_like(x0)], 1), initial(x0[:, 0])),
            "boundary": torch.cat([side, tb], 1),
        }

    return sampler


def _value(u: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """u − y at one point (Dirichlet, initial or data rows)."""
    return u(x) - y


def _zero(u: Any, x: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return u(x)


# -- 2-D Poisson ----------------------------------------------------------------------------
def poisson_exact(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(math.pi * x[..., 0]) * torch.sin(math.pi * x[..., 1])


def _poisson_pde(u: Any, x: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return -_laplacian(u, x) - 2 * math.pi**2 * poisson_exact(x)


def _square(
    name: str,
    pde: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor],
    exact: Callable[[torch.Tensor], torch.Tensor],
    side: tuple[float, float],
    rows: dict[str, int],
    **network: Any,
) -> Problem:
    """A 2-D problem on the square ``side``², u = 0 on its edge: uniform interior points,
    uniform edge points, the reference on a 101 × 101 grid."""
    lo, hi = side

    def sampler(counts: dict[str, int], g: torch.Generator) -> Points:
        return {
            "pde": _uniform(counts["pde"], [lo, lo], [hi, hi], g),
            "boundary": _square_edge(counts["boundary"], lo, hi, g),
        }

    def distance(p: torch.Tensor) -> torch.Tensor:
        # Zero on the edge, 1 at the centre.
        half = ((hi - lo) / 2) ** 2
        return ((p - lo) * (hi - p)).prod(-1) / half**2

    t = torch.linspace(lo, hi, 101, dtype=F64)
    x = torch.cartesian_prod(t, t)
    return Problem(
        name,
        PointResidual(ResidualGroup("pde", pde), ResidualGroup("boundary", _zero)),
        sampler,
        rows,
        x,
        exact(x),
        built_in=BuiltIn(distance, None, ("boundary",)),
        **network,
    )


#: Energy natural gradient descent's accuracy on its PINN examples, the paper's own range.
ENGD = ("ENGD; 1e-6 to 1e-8 over its examples, upper end shown", 1e-6, "Müller & Zeinhofer 2023")


def poisson() -> Problem:
    rows = {"pde": 400, "boundary": 100}
    return _square(
        "poisson",
        _poisson_pde,
        poisson_exact,
        (0.0, 1.0),
        rows,
        width=20,
        depth=2,
        published=[ENGD],
    )


# -- 2-D Helmholtz -------------------------------------------------------------------------
HELMHOLTZ_A = (1.0, 4.0)
HELMHOLTZ_K = 1.0


def helmholtz_exact(x: torch.Tensor) -> torch.Tensor:
    a1, a2 = HELMHOLTZ_A
    return torch.sin(a1 * math.pi * x[..., 0]) * torch.sin(a2 * math.pi * x[..., 1])


def helmholtz_source(x: torch.Tensor) -> torch.Tensor:
    """q = Δu + k²u of the exact solution: (k² − (a₁π)² − (a₂π)²) u."""
    a1, a2 = HELMHOLTZ_A
    return (HELMHOLTZ_K**2 - (a1 * math.pi) ** 2 - (a2 * math.pi) ** 2) * helmholtz_exact(x)


def _helmholtz_pde(u: Any, x: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    return _laplacian(u, x) + HELMHOLTZ_K**2 * u(x) - helmholtz_source(x)


def helmholtz() -> Problem:
    return _square(
        "helmholtz",
        _helmholtz_pde,
        helmholtz_exact,
        (-1.0, 1.0),
        {"pde": 900, "boundary": 200},
        width=30,
        depth=3,
        published=[
            ("PINN, Adam, best network size", 4e-2, "Niu et al. 2024, rerunning Wang et al. 2021"),
            ("adaptive weights, Adam, best", 3.5e-3, "Niu et al. 2024, rerunning Wang et al. 2021"),
        ],
    )


# -- Burgers -------------------------------------------------------------------------------
def _burgers_pde(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    ux, ut, uxx = _space_time(u, p)
    return ut + u(p) * ux - BURGERS_NU * uxx


def burgers() -> Problem:
    sampler = _line_in_time((-1.0, 1.0), lambda x: -torch.sin(math.pi * x), sides=(-1.0, 1.0))
    # Raissi et al.'s grid: 256 points in x, 100 in t.
    xs = np.linspace(-1, 1, 256)
    ts = np.linspace(0, 0.99, 100)
    xx, tt = np.meshgrid(xs, ts, indexing="ij")
    ref = burgers_cole_hopf(xx, tt)
    test_x = torch.tensor(np.stack([xx.ravel(), tt.ravel()], 1), dtype=F64)
    return Problem(
        "burgers",
        PointResidual(
            ResidualGroup("pde", _burgers_pde),
            ResidualGroup("initial", _value),
            ResidualGroup("boundary", _zero),
        ),
        sampler,
        # The shock at x = 0 needs the points: with 1,000 LM stayed at 0.22 for 300 s,
        # with 8,000 it reached 1e-3 in 120 s (Raissi et al. take 10⁴).
        {"pde": 8000, "initial": 100, "boundary": 100},
        test_x,
        torch.tensor(ref.ravel(), dtype=F64),
        width=20,
        depth=3,
        published=[
            ("PINN, L-BFGS (9 × 20, 10⁴ points)", 6.7e-4, "Raissi et al. 2019, §3.1"),
        ],
        built_in=BuiltIn(
            lambda p: (1 - p[..., 0] ** 2) * p[..., 1],
            lambda p: -torch.sin(math.pi * p[..., 0]),
            ("initial", "boundary"),
        ),
        in_time=True,
    )


# -- Allen–Cahn ---------------------------------------------------------------------------
def _allen_cahn_pde(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    _ux, ut, uxx = _space_time(u, p)
    v = u(p)
    return ut - AC_D * uxx + AC_GAMMA * (v**3 - v)


def _periodic(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    """u(−1, t) − u(1, t) at a point p = (−1, t)."""
    return u(p) - u(p + torch.tensor([2.0, 0.0], dtype=p.dtype, device=p.device))


def _periodic_slope(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    """u_x(−1, t) − u_x(1, t) at a point p = (−1, t)."""
    shift = torch.tensor([2.0, 0.0], dtype=p.dtype, device=p.device)
    grad = torch.func.jacrev(u)
    return grad(p)[0] - grad(p + shift)[0]


def allen_cahn() -> Problem:
    def sampler(rows: dict[str, int], g: torch.Generator) -> Points:
        x0 = _uniform(rows["initial"], [-1], [1], g)
        initial = torch.cat([x0, torch.zeros_like(x0)], 1)

        def left(n: int) -> torch.Tensor:
            tb = _uniform(n, [0], [1], g)
            return torch.cat([torch.full_like(tb, -1.0), tb], 1)

        return {
            "pde": _uniform(rows["pde"], [-1, 0], [1, 1], g),
            "initial": (initial, x0[:, 0] ** 2 * torch.cos(math.pi * x0[:, 0])),
            "periodic": left(rows["periodic"]),
            "periodic_slope": left(rows["periodic_slope"]),
        }

    ref = allen_cahn_reference()[::8]  # 128 of the 1,024 x, every 0.01 in t
    xs = torch.tensor(-1 + 2 * np.arange(1024)[::8] / 1024, dtype=F64)
    test_x = torch.cartesian_prod(xs, torch.tensor(np.linspace(0, 1, 101), dtype=F64))
    return Problem(
        "allen_cahn",
        PointResidual(
            ResidualGroup("pde", _allen_cahn_pde),
            ResidualGroup("initial", _value),
            ResidualGroup("periodic", _periodic),
            ResidualGroup("periodic_slope", _periodic_slope),
        ),
        sampler,
        {"pde": 1000, "initial": 200, "periodic": 50, "periodic_slope": 50},
        test_x,
        torch.tensor(ref.ravel(), dtype=F64),
        width=20,
        depth=3,
        published=[
            ("discrete-time PINN, RK q = 100", 6.99e-3, "Raissi et al. 2019, §4.2"),
        ],
        built_in=BuiltIn(
            lambda p: p[..., 1],
            lambda p: p[..., 0] ** 2 * torch.cos(math.pi * p[..., 0]),
            ("initial",),
        ),
        in_time=True,
        periodic=(2.0, ("periodic", "periodic_slope")),
    )


# -- heat, forward and inverse ----------------------------------------------------------------
HEAT_ALPHA = 0.4


def heat_exact(p: torch.Tensor) -> torch.Tensor:
    return torch.exp(-HEAT_ALPHA * math.pi**2 * p[..., 1]) * torch.sin(math.pi * p[..., 0])


def _heat_pde(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    _ux, ut, uxx = _space_time(u, p)
    return ut - HEAT_ALPHA * uxx


def _heat_pde_unknown(u: Any, p: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    _ux, ut, uxx = _space_time(u, p)
    return ut - u.params["alpha"] * uxx


def _heat_test() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.cartesian_prod(
        torch.linspace(0, 1, 101, dtype=F64), torch.linspace(0, 1, 101, dtype=F64)
    )
    return x, heat_exact(x)


def heat() -> Problem:
    sampler = _line_in_time((0.0, 1.0), lambda x: torch.sin(math.pi * x), sides=(1.0, 0.0))
    x, u = _heat_test()
    return Problem(
        "heat",
        PointResidual(
            ResidualGroup("pde", _heat_pde),
            ResidualGroup("initial", _value),
            ResidualGroup("boundary", _zero),
        ),
        sampler,
        {"pde": 400, "initial": 50, "boundary": 50},
        x,
        u,
        width=20,
        depth=2,
        published=[ENGD],
        built_in=BuiltIn(
            lambda p: 4 * p[..., 0] * (1 - p[..., 0]) * p[..., 1],
            lambda p: torch.sin(math.pi * p[..., 0]),
            ("initial", "boundary"),
        ),
        in_time=True,
    )


def heat_inverse() -> Problem:
    def sampler(rows: dict[str, int], g: torch.Generator) -> Points:
        data = _uniform(rows["data"], [0, 0], [1, 1], g)
        return {"pde": _uniform(rows["pde"], [0, 0], [1, 1], g), "data": (data, heat_exact(data))}

    x, u = _heat_test()
    return Problem(
        "heat_inverse",
        PointResidual(ResidualGroup("pde", _heat_pde_unknown), ResidualGroup("data", _value)),
        sampler,
        {"pde": 400, "data": 200},
        x,
        u,
        width=20,
        depth=2,
        coefficient=HEAT_ALPHA,
    )


PROBLEMS: dict[str, Callable[[], Problem]] = {
    "poisson": poisson,
    "helmholtz": helmholtz,
    "burgers": burgers,
    "allen_cahn": allen_cahn,
    "heat": heat,
    "heat_inverse": heat_inverse,
}


def helmholtz_wide() -> Problem:
    """Helmholtz on a network past P × P: three hidden layers of 256 (P = 132,609) on the
    same 1,100 rows, so that the Gauss–Newton system is solved in residual space."""
    return dataclasses.replace(helmholtz(), name="helmholtz_wide", width=256)


#: Run only when named: the PINNs past P × P (LM against Adam at equal time).
LARGE: dict[str, Callable[[], Problem]] = {"helmholtz_wide": helmholtz_wide}


def helmholtz_2700() -> Problem:
    """Helmholtz on 2,300 equation and 400 edge points: ``_pinn_step.py``'s 2,700 rows."""
    return dataclasses.replace(
        helmholtz(), name="helmholtz_2700", rows={"pde": 2300, "boundary": 400}
    )


#: Run only when named, each with the budget it is run with: the suite's problems resized.
NAMED: dict[str, Callable[[], Problem]] = {"helmholtz_2700": helmholtz_2700}


def problem(name: str) -> Problem:
    """The problem called ``name`` (one of :data:`PROBLEMS`, :data:`LARGE` or :data:`NAMED`)."""
    known = {**PROBLEMS, **LARGE, **NAMED}
    if name not in known:
        raise ValueError(f"unknown PINN problem {name!r}; the suite has {sorted(known)}")
    return known[name]()
