"""Kernels for the Gram product ``G += J_sᵀJ_s`` of one Jacobian chunk.

``JᵀJ = Σ_s J_sᵀJ_s`` over row chunks ``J_s``; only the upper triangle needs to be
formed because ``G`` is symmetric (the idea of the BLAS ``syrk``, which torch does not
expose): on CPU the torch kernel multiplies column blocks ``J_{:,i}ᵀ J_{:,i:}`` straight
into the upper block rows of ``G`` (``B`` blocks cost ``(B+1)/2B`` of the flops of a full
``mm``: 9/16 for eight), in the dtype of ``J``; the lower triangle is mirrored once, in
one pass, when the sum is complete. Blocks are about 96 columns wide, at most eight:
narrower ones make GEMMs too thin to run at full speed. The widths were measured once on
two threads (eight blocks beat four, and sixteen, and the full ``mm``, at P from 200 to
1251; ``bench_jacobian``) and are not timed again at run time: a choice made by timing a
shared machine's first chunks is noise, and NumPy's kernel runs OpenBLAS threads that
fight torch's.
From ``NUMPY_FROM_PARAMS`` columns on, NumPy's ``A.T @ A`` (its BLAS ``syrk``, on a
zero-copy view) is used instead: there the product is large enough that the start-up of
OpenBLAS's threads next to torch's is paid back, and ``syrk`` does half of ``mm``'s flops
where the blocked kernel does 9/16 of them (the measurement is in benchmarks/NOTES.md).
The rule depends only on P, never on a timing. ``MARQUARDT_JACOBIAN_GRAM_KERNEL`` forces
``torch`` or ``numpy``. On GPUs ``addmm_`` forms the whole product.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from . import _settings

__all__ = ["NUMPY_FROM_PARAMS", "GramAccumulator", "choose_kernel", "mirror_upper"]

#: On CPU, NumPy's ``syrk`` forms ``J_sᵀJ_s`` from this many parameters on.
NUMPY_FROM_PARAMS = 1024

_BLOCK_COLUMNS = 96
_MAX_BLOCKS = 8

_masks: dict[tuple[int, torch.device], torch.Tensor] = {}


def _numpy() -> Any | None:
    try:
        import numpy
    except ImportError:  # NumPy is optional: torch works alone.
        return None
    return numpy


def choose_kernel(device: torch.device, params: int = 0) -> str:
    """``device`` on GPUs; on CPU the forced kernel, else NumPy's ``syrk`` from
    ``NUMPY_FROM_PARAMS`` parameters on (when NumPy is installed), else the blocked torch
    kernel."""
    if device.type != "cpu":
        return "device"
    forced = _settings.gram_kernel()
    wanted = forced if forced != "auto" else ("numpy" if params >= NUMPY_FROM_PARAMS else "torch")
    if wanted == "numpy" and _numpy() is not None:
        return "numpy"
    return "torch"


def mirror_upper(upper: torch.Tensor) -> torch.Tensor:
    """The symmetric matrix whose upper triangle is that of ``upper`` (one pass, new tensor)."""
    p = int(upper.shape[0])
    key = (p, upper.device)
    mask = _masks.get(key)
    if mask is None:
        mask = torch.ones(p, p, dtype=torch.bool, device=upper.device).triu_()
        _masks.clear()  # one size at a time is what a training run needs
        _masks[key] = mask
    return torch.where(mask, upper, upper.T)


class GramAccumulator:
    """Running ``JᵀJ`` (upper triangle), ``Jᵀr``, ``rᵀr`` and row count on one device."""

    def __init__(self, params: int, device: torch.device, dtype: torch.dtype) -> None:
        self.params = params
        self.device = device
        self.dtype = dtype
        self.kernel = choose_kernel(device, params)
        self.jtj = torch.zeros(params, params, device=device, dtype=dtype)
        self.jtr = torch.zeros(params, device=device, dtype=dtype)
        self.rss = torch.zeros((), device=device, dtype=dtype)
        self.rows = 0
        blocks = max(1, min(_MAX_BLOCKS, params // _BLOCK_COLUMNS))
        self._edges = sorted({round(i * params / blocks) for i in range(blocks + 1)})

    def add(self, jacobian: torch.Tensor, residuals: torch.Tensor) -> None:
        """``G += JᵀJ``, ``g += Jᵀr``, ``rss += rᵀr`` for one chunk (rows × P)."""
        j = jacobian.to(self.dtype)
        r = residuals.to(self.dtype)
        self.jtr.addmv_(j.t(), r)
        self.rss.add_(torch.dot(r, r))
        self.rows += int(r.numel())
        if self.kernel == "device":
            self.jtj.addmm_(j.t(), j)
        elif self.kernel == "numpy":
            np = _numpy()
            assert np is not None
            a = j.contiguous().numpy()
            self.jtj.add_(torch.from_numpy(a.T @ a))
        else:
            for lo, hi in itertools.pairwise(self._edges):
                self.jtj[lo:hi, lo:].addmm_(j[:, lo:hi].t(), j[:, lo:])

    def finish(self) -> torch.Tensor:
        """The symmetric ``JᵀJ``: mirrored from the upper triangle by the blocked kernel,
        as it is from the kernels that form the whole product."""
        return mirror_upper(self.jtj) if self.kernel == "torch" else self.jtj
