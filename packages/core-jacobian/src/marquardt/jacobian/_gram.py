"""Kernels for the Gram product ``G += J_sᵀJ_s`` of one Jacobian chunk.

``JᵀJ = Σ_s J_sᵀJ_s`` over row chunks ``J_s``; only the upper triangle needs to be
formed because ``G`` is symmetric (the BLAS ``syrk`` idea): on CPU the torch kernel
multiplies column blocks ``J_{:,i}ᵀ J_{:,i:}`` (about half the flops of a full ``mm`` for
many blocks), the NumPy kernel lets NumPy's ``A.T @ A`` call ``syrk`` on the same
buffer (a zero-copy view of the torch tensor). Which is faster depends on the BLAS and
the machine, so on CPU the first chunks time both and the faster one is kept
(``MARQUARDT_JACOBIAN_GRAM_KERNEL`` forces one). On GPUs ``addmm_`` is used.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from typing import Any

import torch

from . import _settings

__all__ = ["GramAccumulator", "choose_kernel", "record_time"]

_BLOCKS = 4
_TRIALS = 2

_lock = threading.Lock()
_measured: dict[tuple[str, torch.dtype, int, str], list[float]] = {}


def _numpy() -> Any | None:
    try:
        import numpy
    except ImportError:  # NumPy is optional: torch works alone.
        return None
    return numpy


def _candidates() -> tuple[str, ...]:
    return ("torch", "numpy") if _numpy() is not None else ("torch",)


def choose_kernel(device: torch.device, dtype: torch.dtype, params: int) -> str:
    """The CPU kernel to use next: forced, still being timed, or the measured fastest."""
    if device.type != "cpu":
        return "device"
    forced = _settings.gram_kernel()
    if forced != "auto":
        return forced if forced in _candidates() else "torch"
    with _lock:
        counts = {k: _measured.get((device.type, dtype, params, k), []) for k in _candidates()}
        # Alternate until every kernel has been timed a few times, then keep the fastest.
        for kernel, times in counts.items():
            if len(times) < _TRIALS:
                return kernel
        return min(counts, key=lambda k: statistics.median(counts[k]))


def record_time(
    device: torch.device, dtype: torch.dtype, params: int, kernel: str, seconds_per_row: float
) -> None:
    """Remember how long ``kernel`` took per row (only the first few timings are kept)."""
    with _lock:
        times = _measured.setdefault((device.type, dtype, params, kernel), [])
        if len(times) < 2 * _TRIALS:
            times.append(seconds_per_row)


class GramAccumulator:
    """Running ``JᵀJ`` (upper triangle), ``Jᵀr``, ``rᵀr`` and row count on one device."""

    def __init__(self, params: int, device: torch.device, dtype: torch.dtype) -> None:
        self.params = params
        self.device = device
        self.dtype = dtype
        self.jtj = torch.zeros(params, params, device=device, dtype=dtype)
        self.jtr = torch.zeros(params, device=device, dtype=dtype)
        self.rss = torch.zeros((), device=device, dtype=dtype)
        self.rows = 0
        self.upper_only = False  # True once a chunk filled only the upper triangle

    def add(self, jacobian: torch.Tensor, residuals: torch.Tensor) -> None:
        """``G += JᵀJ``, ``g += Jᵀr``, ``rss += rᵀr`` for one chunk (rows × P)."""
        j = jacobian.to(self.dtype)
        r = residuals.to(self.dtype)
        self.jtr.addmv_(j.t(), r)
        self.rss.add_(torch.dot(r, r))
        self.rows += int(r.numel())
        kernel = choose_kernel(self.device, self.dtype, self.params)
        start = time.perf_counter()
        if kernel == "device":
            self.jtj.addmm_(j.t(), j)
            return
        if kernel == "numpy":
            np = _numpy()
            assert np is not None
            a = j.contiguous().numpy()
            self.jtj.add_(torch.from_numpy(a.T @ a))
        else:
            self._upper(j)
            self.upper_only = True
        record_time(
            self.device,
            self.dtype,
            self.params,
            kernel,
            (time.perf_counter() - start) / max(1, j.shape[0]),
        )

    def _upper(self, j: torch.Tensor) -> None:
        p = self.params
        edges = [round(i * p / _BLOCKS) for i in range(_BLOCKS + 1)]
        for lo, hi in itertools.pairwise(edges):
            if hi > lo:
                self.jtj[lo:hi, lo:].addmm_(j[:, lo:hi].t(), j[:, lo:])

    def finish(self) -> torch.Tensor:
        """The symmetric ``JᵀJ``, mirrored from the upper triangle.

        Every kernel completes the upper triangle (the blocked one only that), so the
        mirror is right whichever kernels the chunks used; when no chunk used the
        blocked kernel the matrix is already whole and is returned as it is.
        """
        return _symmetrize(self.jtj) if self.upper_only else self.jtj


def _symmetrize(upper: torch.Tensor) -> torch.Tensor:
    """``U + triu(U, 1)ᵀ`` from a matrix whose upper triangle is complete."""
    full = torch.triu(upper)
    return full + torch.triu(upper, 1).t()
