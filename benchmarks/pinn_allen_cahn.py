"""Allen–Cahn by time marching with the initial condition built into every window
(``pinn_suite``'s ``allen_cahn``: u_t − 10⁻⁴ u_xx + 5u³ − 5u = 0 on [−1, 1] × [0, 1],
u(x, 0) = x² cos(πx), periodic in x).

The span [0, 1] is cut into windows ``[t_k, t_{k+1}]``. In window ``k`` the solution is

    u(x, t) = b_k(x) + (t − t_k)·N_k(x, t),    b_0 = u(x, 0),
    b_{k+1}(x) = b_k(x) + (t_{k+1} − t_k)·N_k(x, t_{k+1}),

so each window starts exactly where the last one ended (Wight & Zhao 2021 and Mattey &
Ghosh 2022 march in time with the start as soft rows; Lagaris et al. 1998 build the
condition in). ``N_k`` is a tanh network after `PeriodicFeatures` of x (periodic by
construction, Dong & Ni 2021), and starts from ``N_{k−1}``'s weights. Its only rows are
the equation's, at points of the window, with ``(t_k, b_k, b_k'')`` as each point's
target: ``u_t = N + τN_t`` and ``u_xx = b_k'' + τN_xx`` (τ = t − t_k) come from the
network's own input derivatives, which the forward Laplacian serves. LM steps on a window
until its mean squared residual falls below ``tol`` (or its step cap), then moves on.

`MarchedAllenCahn` is the whole solution (the frozen windows and the one being fitted);
`Windows` fits the windows one LM step at a time (the suite's ``lm_windows``, ``_pinn_lm.py``),
`march` all of them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pinn_problem import F64, tanh_network
from pinn_references import AC_D, AC_GAMMA, allen_cahn_reference
from torch import nn

from marquardt.jacobian import PeriodicFeatures, PointResidual, ResidualGroup
from marquardt.solver import LMA

__all__ = ["MarchSettings", "MarchedAllenCahn", "Windows", "march", "network", "reference"]


def network(harmonics: int, width: int, depth: int, seed: int = 0) -> nn.Sequential:
    """`PeriodicFeatures` of x (period 2, ``harmonics``) and t, then ``depth`` tanh layers of
    ``width`` (float64), one output."""
    inner = tanh_network(2 * harmonics + 1, width, depth, seed)
    return nn.Sequential(PeriodicFeatures(2, 0, 2.0, harmonics), *inner)


def initial(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u(x, 0) = x² cos(πx) and its second derivative."""
    c, s = torch.cos(math.pi * x), torch.sin(math.pi * x)
    return x * x * c, 2 * c - 4 * math.pi * x * s - math.pi**2 * x * x * c


#: The corner's reach in x (`corner`).
CORNER_WIDTH = 0.1


def corner(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """χ(x, t): what turns the periodic extension of u(x, 0) (a corner of slopes ±2 at
    x = ±1, where u = −1) into the corner's solution of the equation linearised about
    u = −1 (v_t = D v_xx − 2γv, v = u + 1): with y = 1 − |x| the distance to x = ±1 and
    S(y, t) = |y| erf(|y|/2√(Dt)) + 2√(Dt/π) exp(−y²/4Dt) (|y| under the heat kernel),

        χ = w(y)·(2e^{−2γt} S(y, t) − 2|y|),    w(y) = exp(−y²/0.1²),

    zero at t = 0 and beyond the corner's reach. A network periodic in x has no corner,
    so without χ every window would keep the initial corner's slopes for ever.
    """
    y = (1 - x.abs()).abs()
    dt = AC_D * t.clamp(min=1e-300)
    s = y * torch.erf(y / (2 * dt.sqrt())) + 2 * (dt / math.pi).sqrt() * torch.exp(
        -y * y / (4 * dt)
    )
    s = torch.where(t > 0, s, y)
    w = torch.exp(-((y / CORNER_WIDTH) ** 2))
    return w * (2 * torch.exp(-2 * AC_GAMMA * t) * s - 2 * y)


def _window_pde(u: Any, p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The equation's row at p = (x, t) for u = c + τN (τ = t − t_k), with
    y = (t_k, c, c_t, c_xx) the known part c = b_k(x) + χ(x, t) and its derivatives."""
    tau = p[1] - y[0]
    n, g, h = u(p), u.grad(p), u.hessian_diagonal(p)
    v = y[1] + tau * n
    return y[2] + n + tau * g[1] - AC_D * (y[3] + tau * h[0]) + AC_GAMMA * (v**3 - v)


RESIDUAL = PointResidual(ResidualGroup("pde", _window_pde))


class MarchedAllenCahn(nn.Module):
    """u over [0, 1] from the windows' networks: window ``k``'s at times in
    ``[edges[k], edges[k + 1])`` (the last network beyond).

    Arguments:
        nets: the windows' networks ``N_k``, in time order.
        edges: the windows' bounds (one more than the windows).
    """

    def __init__(self, nets: list[nn.Module], edges: list[float]) -> None:
        super().__init__()
        self.nets = nn.ModuleList(nets)
        self.edges = edges
        #: The parameters each window fits (P of one network; 0 before the first).
        self.window_params = 0

    def known(self, p: torch.Tensor, k: int) -> torch.Tensor:
        """``(t_k, c, c_t, c_xx)`` at the points ``p`` of window ``k``: the known part
        c = b_k(x) + χ(x, t) of u there and its derivatives (`_window_pde`'s targets)."""
        x = p[:, 0].detach().clone().requires_grad_(True)
        t = p[:, 1].detach().clone().requires_grad_(True)
        b, _ = initial(x)
        for j in range(k):
            end = torch.stack([x, torch.full_like(x, self.edges[j + 1])], 1)
            b = b + (self.edges[j + 1] - self.edges[j]) * self.nets[j](end)[:, 0]
        c = b + corner(x, t)
        cx, ct = torch.autograd.grad(c.sum(), (x, t), create_graph=True)
        (cxx,) = torch.autograd.grad(cx.sum(), x)
        tk = torch.full_like(c, self.edges[k])
        return torch.stack([tk, c.detach(), ct.detach(), cxx.detach()], 1)

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        x, t = p[..., 0], p[..., 1]
        inner = torch.tensor(self.edges[1:-1], dtype=p.dtype, device=p.device)
        k = torch.bucketize(t.contiguous(), inner, right=True).clamp(max=len(self.nets) - 1)
        b = x * x * torch.cos(math.pi * x)
        out = corner(x, t)
        # Every window's network at every point, each kept where it serves: no
        # data-dependent branch, so that torch.func maps it over points.
        for j, net in enumerate(self.nets):
            here = b + (t - self.edges[j]) * net(p)[..., 0]
            out = torch.where(k == j, out + here, out)
            if j + 1 < len(self.nets):
                end = torch.stack([x, torch.full_like(x, self.edges[j + 1])], -1)
                b = b + (self.edges[j + 1] - self.edges[j]) * net(end)[..., 0]
        return out.unsqueeze(-1)


@dataclass(frozen=True)
class MarchSettings:
    """What `march` runs: ``windows`` equal windows, ``points`` (x positions × times) drawn
    per window, LM steps per window until the mean squared row < ``tol`` or ``steps``, the
    network's size, and the LMA keywords."""

    windows: int = 20
    points: tuple[int, int] = (192, 6)
    tol: float = 1e-9
    steps: int = 40
    harmonics: int = 16
    width: int = 24
    depth: int = 2
    lma: dict[str, Any] = field(default_factory=dict)


def reference() -> tuple[torch.Tensor, torch.Tensor]:
    """Test points (128 x × 101 t) and the spectral reference there."""
    ref = allen_cahn_reference()[::8]
    xs = torch.tensor(-1 + 2 * np.arange(1024)[::8] / 1024, dtype=F64)
    test_x = torch.cartesian_prod(xs, torch.tensor(np.linspace(0, 1, 101), dtype=F64))
    return test_x, torch.tensor(ref.ravel(), dtype=F64)


def _points(settings: MarchSettings, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    nx, nt = settings.points
    x = -1 + 2 * torch.rand(nx * nt, generator=g, dtype=F64)
    t = lo + (hi - lo) * torch.rand(nx * nt, generator=g, dtype=F64)
    return torch.stack([x, t], 1)


class Windows:
    """The windows of `MarchSettings`, fitted in turn, one LM step a call of `step`.

    Arguments:
        settings: what to run.
        seed: the seed of the first network and of the points.
    """

    def __init__(self, settings: MarchSettings, seed: int = 0) -> None:
        self.settings = settings
        self.edges = [k / settings.windows for k in range(settings.windows + 1)]
        self.net = network(settings.harmonics, settings.width, settings.depth, seed)
        self.solution = MarchedAllenCahn([], self.edges)
        self.records: list[dict[str, float]] = []
        self._g = torch.Generator().manual_seed(seed)
        self._start()

    @property
    def index(self) -> int:
        """The window being fitted."""
        return len(self.solution.nets) - 1

    def _start(self) -> None:
        k = len(self.solution.nets)
        p = _points(self.settings, self.edges[k], self.edges[k + 1], self._g)
        self.solution.nets.append(self.net)
        self.solution.window_params = sum(p.numel() for p in self.net.parameters())
        self._batch = RESIDUAL.batch(pde=(p, self.solution.known(p, k)))
        self._lma = LMA(self.net, [torch.device("cpu")], RESIDUAL, **self.settings.lma)
        self._steps, self._loss = 0, float("inf")

    def step(self) -> bool:
        """One LM step of the current window; the next window once this one's mean squared
        row is below ``tol`` or its steps are spent. True once the last window is done."""
        loss, terminated = self._lma.step(*self._batch)
        self._steps, self._loss = self._steps + 1, float(loss)
        s = self.settings
        if terminated or self._loss <= s.tol or self._steps >= s.steps:
            return self.advance()
        return False

    def advance(self) -> bool:
        """Freeze the current window's network and start the next window (its network
        starting from the frozen one's weights). True when the current window was the last."""
        k = self.index
        self.records.append({"window": k, "steps": self._steps, "loss": self._loss})
        self.solution.nets[k] = copy.deepcopy(self.net).requires_grad_(False)
        if k + 1 == self.settings.windows:
            return True
        self._start()
        return False


def march(settings: MarchSettings, seed: int = 0) -> Windows:
    """Fit every window of ``settings`` (``Windows.records``: steps and loss of each)."""
    windows = Windows(settings, seed)
    while not windows.step():
        pass
    return windows


def relative_l2(solution: nn.Module, upto: float = 1.0) -> float:
    """‖u − u_ref‖ / ‖u_ref‖ over the test points with t ≤ ``upto``."""
    test_x, test_u = reference()
    keep = test_x[:, 1] <= upto + 1e-12
    with torch.no_grad():
        u = solution(test_x[keep])[:, 0]
    return float((u - test_u[keep]).norm() / test_u[keep].norm())
