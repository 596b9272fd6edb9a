"""The reference solutions of the PINN suite (``pinn_suite.py``) that have no closed form,
computed here, never downloaded: viscous Burgers by the Cole–Hopf transform (Basdevant et
al. 1986, Computers & Fluids 14) and Allen–Cahn by a Fourier spectral method stepped by
ETDRK4 (Cox & Matthews 2002; Kassam & Trefethen 2005, SIAM J. Sci. Comput. 26).
"""

from __future__ import annotations

import functools
import math
import tempfile
from pathlib import Path

import numpy as np

__all__ = [
    "AC_D",
    "AC_GAMMA",
    "BURGERS_NU",
    "allen_cahn_etdrk4",
    "allen_cahn_reference",
    "burgers_cole_hopf",
]

# -- Burgers: Cole–Hopf by Gauss–Hermite --------------------------------------------------------
BURGERS_NU = 0.01 / math.pi


def burgers_cole_hopf(x: np.ndarray, t: np.ndarray, nodes: int = 200) -> np.ndarray:
    """u(x, t) of u_t + u u_x = ν u_xx, u(x, 0) = −sin(πx), by the Cole–Hopf transform.

    With η = 2√(νt)·s the solution is u = −∫ sin(π(x − η)) f(x − η) e^{−s²} ds / ∫ f(x − η)
    e^{−s²} ds, f(y) = exp(−cos(πy) / (2πν)); both integrals by ``nodes``-point
    Gauss–Hermite quadrature, the exponent shifted by its maximum over the nodes so
    that neither overflows (100 nodes already agree with a 40,001-point trapezoid rule
    to 1e-15 over t ∈ [0.01, 1]; NumPy's nodes overflow beyond about 300). ``t = 0``
    gives the initial condition.
    """
    x, t = np.broadcast_arrays(np.asarray(x, float), np.asarray(t, float))
    s, w = np.polynomial.hermite.hermgauss(nodes)
    y = x[..., None] - 2.0 * np.sqrt(BURGERS_NU * t)[..., None] * s
    expo = -np.cos(np.pi * y) / (2 * np.pi * BURGERS_NU)
    weights = w * np.exp(expo - expo.max(axis=-1, keepdims=True))
    u = -(weights * np.sin(np.pi * y)).sum(-1) / weights.sum(-1)
    return np.where(t > 0, u, -np.sin(np.pi * x))


# -- Allen–Cahn: Fourier spectral + ETDRK4 ------------------------------------------------------
AC_D, AC_GAMMA = 1e-4, 5.0


def allen_cahn_etdrk4(
    modes: int = 1024, dt: float = 1e-4, times: int = 101, t_end: float = 1.0
) -> np.ndarray:
    """u(x_j, t_k) of u_t = D u_xx + γ(u − u³), u(x, 0) = x² cos(πx), periodic on [−1, 1),
    on ``modes`` equispaced x_j = −1 + 2j/modes and ``times`` equispaced t_k in [0, t_end].

    Fourier in space, ETDRK4 in time (Cox & Matthews 2002); the φ-functions of the
    linear part by the contour-integral mean of Kassam & Trefethen 2005 (32 points on a
    circle of radius 1 about each dt·L), which avoids their cancellation near zero.
    Returns an array ``(modes, times)``. The initial slope jumps across the periodic
    boundary (u_x(±1, 0) = ∓2) and the interfaces are √(D/γ) ≈ 0.0045 wide, so the modes
    converge algebraically early on: 512 and 1,024 modes differ by 1.3e-4 (max) at
    t = 0.1 and 1.4e-6 at t = 1; halving dt changes nothing above 1e-11.
    """
    x = -1 + 2 * np.arange(modes) / modes
    k = np.pi * np.fft.fftfreq(modes, d=1.0 / modes)  # wavenumbers of period 2
    lin = -AC_D * k**2
    e, e2 = np.exp(dt * lin), np.exp(dt * lin / 2)
    r = np.exp(1j * np.pi * (np.arange(1, 33) - 0.5) / 32)
    lr = dt * lin[:, None] + r[None, :]
    q = dt * np.real(np.mean((np.exp(lr / 2) - 1) / lr, axis=1))
    f1 = dt * np.real(np.mean((-4 - lr + np.exp(lr) * (4 - 3 * lr + lr**2)) / lr**3, axis=1))
    f2 = dt * np.real(np.mean((2 + lr + np.exp(lr) * (-2 + lr)) / lr**3, axis=1))
    f3 = dt * np.real(np.mean((-4 - 3 * lr - lr**2 + np.exp(lr) * (4 - lr)) / lr**3, axis=1))

    def nonlinear(v: np.ndarray) -> np.ndarray:
        u = np.real(np.fft.ifft(v))
        return np.asarray(np.fft.fft(AC_GAMMA * (u - u**3)))

    steps = round(t_end / dt)
    every = steps // (times - 1)
    if every * (times - 1) != steps:
        raise ValueError(f"dt={dt} does not put a step on each of {times} output times")
    v = np.fft.fft(x**2 * np.cos(np.pi * x))
    out = np.empty((modes, times))
    out[:, 0] = np.real(np.fft.ifft(v))
    for n in range(1, steps + 1):
        nv = nonlinear(v)
        a = e2 * v + q * nv
        na = nonlinear(a)
        b = e2 * v + q * na
        nb = nonlinear(b)
        c = e2 * a + q * (2 * nb - nv)
        nc = nonlinear(c)
        v = e * v + nv * f1 + 2 * (na + nb) * f2 + nc * f3
        if n % every == 0:
            out[:, n // every] = np.real(np.fft.ifft(v))
    return out


@functools.lru_cache(maxsize=1)
def allen_cahn_reference() -> np.ndarray:
    """The reference on 1,024 × 101 points, kept in the temporary folder between runs."""
    cache = Path(tempfile.gettempdir()) / "marquardt-allen-cahn-1024x101.npy"
    if cache.exists():
        return np.asarray(np.load(cache))
    ref = allen_cahn_etdrk4()
    np.save(cache, ref)
    return ref
