"""``J_sᵀJ_s`` and ``J_sᵀr_s`` by NumPy's ``syrk`` on row pieces, one piece per thread.

``J_sᵀJ_s = Σ_k J_kᵀJ_k`` over row pieces ``J_k``: each thread forms its own piece's product
with NumPy's ``A.T @ A`` (its BLAS ``syrk``: half the flops of a full ``mm``) while BLAS runs
on one thread, and the caller adds the pieces. This keeps the speed of ``syrk`` on every
core without a BLAS thread pool beside torch's: OpenBLAS's own workers go on spinning after
each call and took the cores from torch's next kernels (a 78 ms step instead of 55 ms on
P = 769, N = 10⁴; benchmarks/NOTES.md). The threads here wait on a queue, not a spin.

The other side of the same contention: torch's OpenMP workers spin after each parallel
kernel (GNU libgomp's ``GOMP_SPINCOUNT``, 300,000 spins by default, a few milliseconds),
and while the Jacobian's last kernel's workers spin the ``syrk`` threads get less than
their cores. libgomp shortens the spin to 1,000 spins when it manages more threads than
there are CPUs (its documented rule), so each worker thread here runs one small parallel
torch kernel when it starts: its own OpenMP team, sleeping otherwise, makes that so when
torch's threads already fill the CPUs. The effect is process-wide, and measured: torch's
kernels in an LM step take the same time with it (benchmarks/NOTES.md).

Needs NumPy and ``threadpoolctl`` (to hold NumPy's BLAS at one thread during the call);
`available` says whether both import. The pool is rebuilt in a forked child, whose copy of
the parent's threads does not exist.
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["MIN_PIECE_ROWS", "available", "gram_pieces", "pieces_for"]

#: Fewer rows than this per piece make the pieces' start-up and their sum cost more than
#: the second core gains (measured at P = 769: 1,000 rows split in two ran no faster).
MIN_PIECE_ROWS = 1000

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _modules() -> tuple[Any, Any] | None:
    """NumPy and a ``threadpoolctl.ThreadpoolController``, or None when either is missing."""
    if "modules" not in _state:
        try:
            numpy = importlib.import_module("numpy")
            threadpoolctl = importlib.import_module("threadpoolctl")
        except ImportError:  # optional: without them the other kernels serve
            _state["modules"] = None
        else:
            _state["modules"] = (numpy, threadpoolctl.ThreadpoolController())
    modules: tuple[Any, Any] | None = _state["modules"]
    return modules


def available() -> bool:
    """Whether NumPy and ``threadpoolctl`` are importable."""
    return _modules() is not None


def pieces_for(rows: int, threads: int) -> int:
    """How many row pieces a chunk of ``rows`` rows is cut into on ``threads`` threads."""
    return max(1, min(threads, rows // MIN_PIECE_ROWS))


def _shorten_openmp_spin() -> None:
    """Pool initializer: one parallel torch kernel, so that this thread owns an OpenMP team."""
    torch.ones(1 << 18).sum()


def _pool(workers: int) -> ThreadPoolExecutor:
    """The pool of ``workers`` threads, made anew when the size or the process changed."""
    with _lock:
        key = (workers, os.getpid())
        if _state.get("pool_key") != key:
            _state["pool"] = ThreadPoolExecutor(
                max_workers=workers,
                thread_name_prefix="marquardt-gram",
                initializer=_shorten_openmp_spin,
            )
            _state["pool_key"] = key
        pool: ThreadPoolExecutor = _state["pool"]
        return pool


def _piece(numpy: Any, a: Any, r: Any) -> tuple[Any, Any]:
    # ``a.T @ a`` of a C-contiguous ``a`` is NumPy's syrk; both products release the GIL.
    return a.T @ a, numpy.matmul(r, a)


def gram_pieces(
    jacobian: torch.Tensor, residuals: torch.Tensor, pieces: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(JᵀJ, Jᵀr)`` of one chunk (rows × P, float32 or float64, on CPU), formed in
    ``pieces`` row pieces on as many threads (the caller's and ``pieces - 1`` others).

    Raises:
        RuntimeError: NumPy or ``threadpoolctl`` is missing (see `available`).
    """
    modules = _modules()
    if modules is None:
        raise RuntimeError("the threaded Gram kernel needs NumPy and threadpoolctl")
    numpy, controller = modules
    a = jacobian.detach().contiguous().numpy()
    r = residuals.detach().contiguous().numpy()
    rows = int(a.shape[0])
    edges = [round(i * rows / pieces) for i in range(pieces + 1)]
    spans = list(itertools.pairwise(edges))
    with controller.limit(limits=1, user_api="blas"):
        futures: list[Future[tuple[Any, Any]]] = []
        if pieces > 1:
            pool = _pool(pieces - 1)
            futures = [pool.submit(_piece, numpy, a[lo:hi], r[lo:hi]) for lo, hi in spans[1:]]
        lo, hi = spans[0]
        jtj, jtr = _piece(numpy, a[lo:hi], r[lo:hi])
        for future in futures:
            more_jtj, more_jtr = future.result()
            jtj += more_jtj
            jtr += more_jtr
    return torch.from_numpy(jtj), torch.from_numpy(jtr)
