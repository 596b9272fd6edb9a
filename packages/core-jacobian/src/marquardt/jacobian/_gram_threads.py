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
their cores. libgomp shortens the spin to 1,000 spins while it manages more threads than
there are CPUs (its documented rule). `short_openmp_spin` makes that so while
accumulations with this kernel go on: a thread runs one small parallel torch kernel (an
OpenMP team of its own, which sleeps) and exits ``HOLD_SECONDS`` after the last of them,
which gives the team back. Not for longer: torch's own short kernels, as in the step of a
small network, run slower with the short spin (a 1-64-1 step 6.7 → 8.3 ms measured).

Needs NumPy and ``threadpoolctl`` (to hold NumPy's BLAS at one thread during the call);
`available` says whether both import. A forked child starts afresh: the parent's threads
do not exist there.
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "HOLD_SECONDS",
    "MIN_PIECE_ROWS",
    "PieceBuffers",
    "available",
    "gram_pieces",
    "pieces_for",
    "short_openmp_spin",
]

#: Fewer rows than this per piece make the pieces' start-up and their sum cost more than
#: the second core gains (measured at P = 769: 1,000 rows split in two ran no faster).
MIN_PIECE_ROWS = 1000

#: How long the short spin outlives the last block that asked for it: longer than the
#: solve and trial between two steps of one fit, short enough that other torch work
#: soon after (a small network's fit) runs with the usual spin.
HOLD_SECONDS = 0.1

_lock = threading.Lock()
_held = threading.Condition()
_state: dict[str, Any] = {"open": 0, "hold_until": 0.0, "holder": None}


def _after_fork_in_child() -> None:
    # The parent's threads do not exist here, and a lock another thread held may be held.
    global _lock, _held
    _lock = threading.Lock()
    _held = threading.Condition()
    _state.update({"open": 0, "hold_until": 0.0, "holder": None})
    _state.pop("pool", None)
    _state.pop("pool_workers", None)


os.register_at_fork(after_in_child=_after_fork_in_child)


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


def _hold() -> None:
    """The holder thread: one parallel torch kernel (an OpenMP team of its own, which then
    sleeps), then wait until ``HOLD_SECONDS`` have passed with no block open."""
    torch.ones(1 << 18, device="cpu").sum()
    with _held:
        while True:
            left = _state["hold_until"] - time.monotonic()
            if _state["open"] == 0 and left <= 0:
                _state["holder"] = None
                return
            _held.wait(timeout=max(left, 0.01) if _state["open"] == 0 else None)


@contextmanager
def short_openmp_spin(active: bool = True) -> Iterator[None]:
    """While the block runs (and ``active``), and for ``HOLD_SECONDS`` after the last such
    block, libgomp spins 1,000 times, not 300,000, before a waiting OpenMP worker sleeps
    (see the module's docstring).

    The holder thread starts its team while the block's own work begins (waiting for it
    cost 2 ms a step: the cores are busy with the workers still spinning from earlier
    kernels). It outlives the block by ``HOLD_SECONDS`` so that the steps of one fit do
    not start a thread each (1–2 ms a step at P = 769, N = 10⁴), and then ends, which
    gives the team back.
    """
    if not active:
        yield
        return
    with _held:
        _state["open"] += 1
        holder = _state.get("holder")
        if holder is None or not holder.is_alive():
            holder = threading.Thread(target=_hold, name="marquardt-openmp-spin", daemon=True)
            _state["holder"] = holder
            holder.start()
    try:
        yield
    finally:
        with _held:
            _state["open"] -= 1
            _state["hold_until"] = time.monotonic() + HOLD_SECONDS
            _held.notify_all()


def _pool(workers: int) -> ThreadPoolExecutor:
    """The pool of ``workers`` threads, made anew when the size changed (or after a fork)."""
    with _lock:
        if _state.get("pool_workers") != workers:
            if _state.get("pool") is not None:
                _state["pool"].shutdown(wait=False)  # its idle threads end
            _state["pool"] = ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="marquardt-gram"
            )
            _state["pool_workers"] = workers
        pool: ThreadPoolExecutor = _state["pool"]
        return pool


def _piece(numpy: Any, a: Any, r: Any, out: tuple[Any, Any]) -> None:
    # ``a.T @ a`` of a C-contiguous ``a`` is NumPy's syrk (``out`` or not); both products
    # release the GIL.
    numpy.matmul(a.T, a, out=out[0])
    numpy.matmul(r, a, out=out[1])


class PieceBuffers:
    """The ``(J_kᵀJ_k, J_kᵀr_k)`` arrays of each piece, made once per accumulation and
    reused for every chunk of it (a step over 10⁶ rows in chunks of 10⁴ would otherwise
    make 200 new ``P × P`` arrays)."""

    def __init__(self, params: int, dtype: torch.dtype) -> None:
        self.params = params
        self.dtype = dtype
        self._arrays: list[tuple[Any, Any]] = []

    def get(self, pieces: int) -> list[tuple[Any, Any]]:
        """The arrays of ``pieces`` pieces (made on first use)."""
        p, dtype = self.params, self.dtype
        while len(self._arrays) < pieces:
            self._arrays.append(
                (torch.empty(p, p, dtype=dtype).numpy(), torch.empty(p, dtype=dtype).numpy())
            )
        return self._arrays[:pieces]


def gram_pieces(
    jacobian: torch.Tensor, residuals: torch.Tensor, pieces: int, buffers: PieceBuffers
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(JᵀJ, Jᵀr)`` of one chunk (rows × P, float32 or float64, on CPU), formed in
    ``pieces`` row pieces on as many threads (the caller's and ``pieces - 1`` others).

    The results are views of ``buffers``' first arrays: add them up before the next call.

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
    outs = buffers.get(pieces)
    with controller.limit(limits=1, user_api="blas"):
        futures: list[Future[None]] = []
        if pieces > 1:
            pool = _pool(pieces - 1)
            futures = [
                pool.submit(_piece, numpy, a[lo:hi], r[lo:hi], out)
                for (lo, hi), out in zip(spans[1:], outs[1:], strict=True)
            ]
        lo, hi = spans[0]
        _piece(numpy, a[lo:hi], r[lo:hi], outs[0])
        jtj, jtr = outs[0]
        for future, (more_jtj, more_jtr) in zip(futures, outs[1:], strict=True):
            future.result()
            jtj += more_jtj
            jtr += more_jtr
    return torch.from_numpy(jtj), torch.from_numpy(jtr)
