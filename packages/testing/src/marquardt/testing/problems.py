"""The problems the benchmarks and the tests share: the seed's sinc network, a decay and a
Gaussian curve, 2-D Gaussian spots, and the 2-D Poisson problem of the PINNs.

Each curve comes as a torch function (a model for ``curve_fit``) and a NumPy one (SciPy's
side, and the data); each problem draws its data from a seed, the same for every side.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from marquardt.testing.curves import decay

__all__ = [
    "decay",
    "decay_numpy",
    "gauss2d",
    "gauss2d_numpy",
    "gaussian",
    "gaussian_numpy",
    "poisson_boundary",
    "poisson_exact",
    "poisson_pde",
    "poisson_residual",
    "poisson_source",
    "sinc",
    "spots",
    "tanh_mlp",
]


# -- the seed's network: y = sinc(10 x), fitted by a tanh MLP -------------------------------
def sinc(n: int = 100_000) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed's data (cuPyLMA's tutorial).

    **Arguments:**

    - `n`: the number of points, evenly spaced on [−1, 1].

    **Returns:** ``x`` (n × 1, float32) and ``y = sinc(10 x)``.
    """
    x = torch.linspace(-1, 1, n, dtype=torch.float32).unsqueeze(1)
    return x, torch.sinc(10 * x)


def tanh_mlp(widths: Sequence[int], seed: int = 0) -> nn.Module:
    """A tanh MLP, initialised from ``seed`` (the same start for every optimizer).

    **Arguments:**

    - `widths`: the layer widths, ``(1, 64, 64, 1)`` for 1-64-64-1.
    - `seed`: torch's seed for the initial parameters.

    **Returns:** the ``nn.Sequential`` of linear layers with tanh between them.
    """
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        if i:
            layers.append(nn.Tanh())
        layers.append(nn.Linear(fan_in, fan_out))
    return nn.Sequential(*layers)


# -- curves: y = a·exp(−b·x) + c, a Gaussian with an offset ---------------------------------
def decay_numpy(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    """y = a·exp(−b·x) + c, in NumPy (``decay``'s twin)."""
    return a * np.exp(-b * x) + c


def gaussian(x: torch.Tensor, a: Any, mu: Any, s: Any, offset: Any) -> torch.Tensor:
    """y = a·exp(−((x − μ)/s)²/2) + offset."""
    return a * torch.exp(-0.5 * ((x - mu) / s) ** 2) + offset


def gaussian_numpy(x: np.ndarray, a: float, mu: float, s: float, offset: float) -> np.ndarray:
    """``gaussian`` in NumPy."""
    return a * np.exp(-0.5 * ((x - mu) / s) ** 2) + offset


# -- 2-D Gaussian spots (Gpufit's and Cpufit's problem) -------------------------------------
def gauss2d(xy: torch.Tensor, a: Any, x0: Any, y0: Any, w: Any, b: Any) -> torch.Tensor:
    """A round 2-D Gaussian spot on a background: a·exp(−|xy − (x0, y0)|²/(2w²)) + b."""
    return a * torch.exp(-((xy[0] - x0) ** 2 + (xy[1] - y0) ** 2) / (2 * w**2)) + b


def gauss2d_numpy(xy: np.ndarray, a: float, x0: float, y0: float, w: float, b: float) -> np.ndarray:
    """``gauss2d`` in NumPy."""
    return a * np.exp(-((xy[0] - x0) ** 2 + (xy[1] - y0) ** 2) / (2 * w**2)) + b


def spots(size: int, fits: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``fits`` spots of ``size`` × ``size`` pixels with Poisson noise, as Gpufit's example.

    Amplitude 500, background 10, width U(0.9, 1.1), centre within half a pixel of the
    middle; the start is the truth scaled by U(0.8, 1.2) (amplitude, width, background)
    and moved by U(−0.3, 0.3) pixels.

    **Arguments:**

    - `size`: the side in pixels.
    - `fits`: how many spots.
    - `seed`: NumPy's seed.

    **Returns:** ``x`` (2, size²; x the fast index), ``y`` (fits, size²), ``p0`` and
    ``true`` (fits, 5: a, x0, y0, w, b).
    """
    rng = np.random.default_rng(seed)
    index = np.arange(size * size)
    grid = np.stack([index % size, index // size]).astype(np.float64)
    centre = (size - 1) / 2
    true = np.c_[
        np.full(fits, 500.0),
        centre + rng.uniform(-0.5, 0.5, (fits, 2)),
        rng.uniform(0.9, 1.1, fits),
        np.full(fits, 10.0),
    ]
    y = rng.poisson(gauss2d_numpy(grid[:, None, :], *(true.T[..., None]))).astype(np.float64)
    p0 = (
        true
        * np.c_[rng.uniform(0.8, 1.2, fits), np.ones((fits, 2)), rng.uniform(0.8, 1.2, (fits, 2))]
    )
    p0[:, 1:3] += rng.uniform(-0.3, 0.3, (fits, 2))
    return {"x": grid, "y": y, "p0": p0, "true": true}


# -- 2-D Poisson: −Δu = 2π² sin(πx) sin(πy) on the unit square, u = 0 on its edge ------------
def poisson_source(x: torch.Tensor) -> torch.Tensor:
    """f = 2π² sin(πx) sin(πy) at the points ``x`` (… × 2)."""
    return 2 * math.pi**2 * poisson_exact(x)


def poisson_exact(x: torch.Tensor) -> torch.Tensor:
    """The exact solution u = sin(πx) sin(πy) at the points ``x`` (… × 2)."""
    return torch.sin(math.pi * x[..., 0]) * torch.sin(math.pi * x[..., 1])


def poisson_pde(u: Any, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """−Δu − f at one interior point ``x`` (``u`` the network at one point, a ``PointModel``:
    ``u.laplacian`` lets the engine propagate Δu forward with the values)."""
    return -u.laplacian(x) - f


def poisson_boundary(u: Any, x: torch.Tensor, _y: torch.Tensor) -> torch.Tensor:
    """u at one boundary point (u = 0 there)."""
    return u(x)


def poisson_residual() -> Any:
    """The Poisson residual in two groups, "pde" and "boundary" (a ``PointResidual``;
    needs ``marquardt-jacobian``)."""
    from marquardt.jacobian import PointResidual, ResidualGroup

    return PointResidual(
        ResidualGroup("pde", poisson_pde), ResidualGroup("boundary", poisson_boundary)
    )
