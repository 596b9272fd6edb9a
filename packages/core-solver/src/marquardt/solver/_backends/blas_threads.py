"""One BLAS thread for NumPy/SciPy calls made between torch's parallel kernels.

NumPy and SciPy ship their own OpenBLAS, with its own thread pool next to torch's OpenMP
pool. In an LM step the two alternate (torch forms the Jacobian, NumPy factorises), so
each pool's threads are still spinning while the other's work: on 2 cores a P × P
Cholesky right after torch work ran many times slower with two OpenBLAS threads than with
one (``bench_backends``). The P × P solves gain little from a second thread anyway. ``threadpoolctl`` (when installed) limits
the BLAS pools for the duration of a ``with one_blas_thread():`` block; without it the
block does nothing.
"""

from __future__ import annotations

import importlib
from contextlib import AbstractContextManager, nullcontext
from typing import Any

__all__ = ["one_blas_thread"]

_controller: list[Any] = []


def _get_controller() -> Any | None:
    if not _controller:
        try:
            module = importlib.import_module("threadpoolctl")
        except ImportError:  # optional: without it BLAS keeps its own thread count
            _controller.append(None)
        else:
            _controller.append(module.ThreadpoolController())
    return _controller[0]


def one_blas_thread() -> AbstractContextManager[Any]:
    """A context in which NumPy's and SciPy's BLAS/LAPACK use one thread."""
    controller = _get_controller()
    if controller is None:
        return nullcontext()
    limited: AbstractContextManager[Any] = controller.limit(limits=1, user_api="blas")
    return limited
