"""Kernels for the Gram product ``G += J_sᵀJ_s`` of one Jacobian chunk.

``JᵀJ = Σ_s J_sᵀJ_s`` over row chunks ``J_s``. On CPU, three kernels, chosen by a fixed
rule on the shape (never by a timing: a choice made by timing a shared machine's first
chunks is noise):

- ``numpy-threads`` (``_gram_threads``): NumPy's ``syrk`` on row pieces, one per torch
  thread, BLAS at one thread each; ``Jᵀr`` in the same pass. Used with two or more torch
  threads from ``THREADS_FROM_PARAMS`` to ``NUMPY_FROM_PARAMS`` parameters, where a chunk
  has at least ``MIN_PIECE_ROWS`` rows a piece (NumPy and ``threadpoolctl`` installed).
  Each piece's product is a ``P × P`` temporary, so it stops where those begin to weigh
  on the step's peak memory.
- ``torch``: column blocks ``J_{:,i}ᵀ J_{:,i:}`` multiplied straight into the upper block
  rows of ``G`` (the idea of the BLAS ``syrk``, which torch does not expose; ``B`` blocks
  cost ``(B+1)/2B`` of the flops of a full ``mm``: 9/16 for eight), in the dtype of ``J``;
  the lower triangle is mirrored once, when the sum is complete. Blocks are about 96
  columns wide, at most eight: narrower ones make GEMMs too thin to run at full speed
  (eight beat four, and sixteen, and the full ``mm``, at P from 200 to 1251 on two threads;
  ``bench_jacobian``).
- ``numpy``: NumPy's ``A.T @ A`` on the whole chunk with its BLAS's own threads, from
  ``NUMPY_FROM_PARAMS`` parameters on where the threaded kernel does not apply.

The measurements behind the thresholds are in benchmarks/NOTES.md.
``MARQUARDT_JACOBIAN_GRAM_KERNEL`` forces ``torch``, ``numpy`` or ``numpy-threads``. On
GPUs ``addmm_`` forms the whole product.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from . import _gram_threads, _settings

__all__ = [
    "NUMPY_FROM_PARAMS",
    "THREADS_FROM_PARAMS",
    "GramAccumulator",
    "choose_kernel",
    "mirror_upper",
]

#: On CPU, NumPy's ``syrk`` forms ``J_sᵀJ_s`` from this many parameters on.
NUMPY_FROM_PARAMS = 1024
#: On CPU with two or more torch threads, the threaded ``syrk`` from this many parameters
#: up to ``NUMPY_FROM_PARAMS`` (where the chunk has rows enough for two pieces).
THREADS_FROM_PARAMS = 256
_NUMPY_DTYPES = (torch.float32, torch.float64)

_BLOCK_COLUMNS = 96
_MAX_BLOCKS = 8

_masks: dict[tuple[int, torch.device], torch.Tensor] = {}


def _numpy() -> Any | None:
    try:
        import numpy
    except ImportError:  # NumPy is optional: torch works alone.
        return None
    return numpy


def choose_kernel(
    device: torch.device,
    params: int = 0,
    rows: int = 0,
    dtype: torch.dtype = torch.float32,
) -> str:
    """``device`` on GPUs. On CPU the forced kernel, else ``numpy-threads`` where it
    applies (see the module's docstring), else NumPy's ``syrk`` from ``NUMPY_FROM_PARAMS``
    parameters on, else the blocked torch kernel. A forced kernel that cannot run here
    (NumPy or ``threadpoolctl`` missing, a dtype NumPy lacks) gives way to the next."""
    if device.type != "cpu":
        return "device"
    if dtype not in _NUMPY_DTYPES or _numpy() is None:
        return "torch"
    threads = torch.get_num_threads()
    forced = _settings.gram_kernel()
    if forced != "auto":
        wanted = forced
    elif (
        THREADS_FROM_PARAMS <= params < NUMPY_FROM_PARAMS
        and threads >= 2
        and _gram_threads.pieces_for(rows, threads) >= 2
    ):
        wanted = "numpy-threads"
    else:
        wanted = "numpy" if params >= NUMPY_FROM_PARAMS else "torch"
    if wanted == "numpy-threads" and not _gram_threads.available():
        wanted = "numpy" if forced == "numpy-threads" or params >= NUMPY_FROM_PARAMS else "torch"
    return wanted


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
    """Running ``JᵀJ`` (its upper triangle only with the torch kernel), ``Jᵀr``, ``rᵀr``
    and row count on one device.

    ``rows``: the rows of the chunks to come (the largest), which the kernel's choice
    reads.
    """

    def __init__(
        self, params: int, device: torch.device, dtype: torch.dtype, rows: int = 0
    ) -> None:
        self.params = params
        self.device = device
        self.dtype = dtype
        self.kernel = choose_kernel(device, params, rows, dtype)
        self._pieces = _gram_threads.PieceBuffers(params, dtype)
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
        self.rss.add_(torch.dot(r, r))
        self.rows += int(r.numel())
        if self.kernel == "numpy-threads":
            threads = torch.get_num_threads()
            jtj, jtr = _gram_threads.gram_pieces(
                j, r, _gram_threads.pieces_for(int(r.numel()), threads), self._pieces
            )
            self.jtj.add_(jtj)
            self.jtr.add_(jtr)
            return
        self.jtr.addmv_(j.t(), r)
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
