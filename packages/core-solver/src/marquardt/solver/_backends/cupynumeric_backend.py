"""The cuPyNumeric backend: the LM system assembled and solved in Legate, over its processors.

Assembly (see ``base``; Marquardt 1963, Nielsen 1999): over-determined A = JᵀJ/N,
g = Jᵀr/N; under-determined B = JJᵀ/N, g = r/N with δ = Jᵀu. Strategy "explicit" copies
each Jacobian slice J_s into one Legate array J (N × P), which Legate partitions over its
GPUs (or CPU processors), and forms the products there; strategy "accumulate" hands over
the P × P products the model devices already summed. A and g are kept in float64. Each
damped solve, (A + λD)δ = g, is ``cupynumeric.linalg.cholesky`` followed by two triangular
solves (``cho_solve``), in float64; a failed factorisation (cuPyNumeric raises
``LinAlgError``) or a non-finite δ returns ``None``, a rejected attempt. δ comes back as a
float64 CPU torch tensor, to be broadcast to the model replicas.

How slices reach Legate (facts of the 26.x wheels):

* A CPU slice is attached zero-copy with ``cupynumeric.from_dlpack``. Legate reads attached
  buffers asynchronously, which is safe only because the Jacobian engine hands out fresh
  tensors and never writes them again.
* Legate can attach a CUDA tensor only if it sits on a GPU that Legate itself owns, and the
  model side runs on the other GPUs; so a CUDA slice is copied into a fresh pinned host
  buffer (one per slice, never reused) and that buffer is attached.
* ``A.T @ A`` for a tall A splits A's rows across processors only when
  (m+n)·k·itemsize < ``CUPYNUMERIC_MATMUL_CACHE_SIZE`` × processors (128 MiB by default),
  otherwise it batches over k on a few processors. Before its first product the backend
  raises that setting to ``MATMUL_CACHE_SIZE`` unless the user has set it.
* Factorisation: ``cholesky`` is tiled across processors only above n = 8192, so for the
  usual P it runs on one processor; P × P is small next to J.

cuPyNumeric is imported when a backend is created, never when this module is imported:
importing it starts the Legate runtime, which changes process state.
"""

from __future__ import annotations

import importlib
import os
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from marquardt.jacobian import JacobianSlice, NormalProducts

from .._errors import BackendUnavailableError
from .base import ArrayBackend, LinearSystem, Solution
from .scaling import check_scaling, scaling_diagonal
from .systems import ArrayOps, gather_slices, normal_system, solution, system_from_matrix

__all__ = ["MATMUL_CACHE_SIZE", "CupynumericBackend", "create_backend"]

#: Value given to ``CUPYNUMERIC_MATMUL_CACHE_SIZE`` when unset (bytes per processor), so
#: that JᵀJ of a tall J is split by rows over all of Legate's processors.
MATMUL_CACHE_SIZE = 1 << 33

_CACHE_VARIABLE = "CUPYNUMERIC_MATMUL_CACHE_SIZE"

#: Torch dtypes cuPyNumeric's linear algebra does not take; they are widened to float32.
_NARROW = (torch.float16, torch.bfloat16)


def _import_cupynumeric() -> Any:
    """``cupynumeric`` (starting Legate if it is not running), or a house-style error."""
    # cuPyNumeric reads this on its first matrix product, so it must be set beforehand.
    os.environ.setdefault(_CACHE_VARIABLE, str(MATMUL_CACHE_SIZE))
    try:
        return importlib.import_module("cupynumeric")
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend='cupynumeric' was asked for, but cuPyNumeric cannot be imported ({exc}). "
            "HINT: pip install 'marquardt-solver[legate]'; the PyPI wheels need an NVIDIA "
            "driver (libcuda.so.1), or use backend='torch' or 'numpy'"
        ) from exc


class CupynumericBackend:
    """Assemble and solve in cuPyNumeric on Legate's processors. See the module docstring."""

    name = "cupynumeric"

    def __init__(self) -> None:
        self._cn: Any = _import_cupynumeric()
        self._linalg: Any = importlib.import_module("cupynumeric.linalg")
        runtime: Any = importlib.import_module("legate.core").get_legate_runtime()
        self._runtime = runtime
        cn = self._cn
        self._ops = ArrayOps(
            float64=lambda x: x.astype(cn.float64),
            column_squares=lambda j: (j * j).sum(axis=0, dtype=cn.float64),
            diagonal=lambda a: cn.diagonal(a).copy(),
        )
        # D as a dense P × P (or I as N × N) matrix for the system being solved: a step
        # solves one system for several λ, and each Legate operation costs about a
        # millisecond on CPUs, so D is built once per system and scaling.
        # The system is held weakly: an under-determined one carries J, which must be freed
        # when the caller drops it, not when the next system arrives.
        self._damping_key: tuple[weakref.ref[LinearSystem], str] | None = None
        self._damping_matrix: Any = None

    # -- moving torch tensors into Legate ------------------------------------------------

    def _attach(self, tensor: torch.Tensor) -> Any:
        """A Legate array reading ``tensor``'s values (zero-copy for CPU tensors).

        The buffer attached is either the caller's fresh tensor (never written again) or a
        fresh host copy made here, so Legate's asynchronous reads are safe.
        """
        t = tensor.detach()
        if t.dtype in _NARROW:
            t = t.float()
        if t.device.type == "cuda":
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            with torch.cuda.device(t.device):
                stream = torch.cuda.current_stream()
                host.copy_(t, non_blocking=True)
                # The pinned copy must be complete before Legate starts reading it.
                stream.synchronize()
            t = host
        elif t.device.type != "cpu":
            t = t.to("cpu")
        return self._cn.from_dlpack(t.contiguous())

    def _fresh_float64(self, tensor: torch.Tensor) -> Any:
        """A Legate float64 array holding a private copy of ``tensor`` (small arrays only)."""
        host = tensor.detach().to("cpu", torch.float64, copy=True).contiguous()
        return self._cn.from_dlpack(host)

    # -- assembly -------------------------------------------------------------------------

    def system_from_products(self, products: NormalProducts) -> LinearSystem:
        n = int(products.rows)
        a = self._fresh_float64(products.jtj) / n
        g = self._fresh_float64(products.jtr.reshape(-1)) / n
        return normal_system(a, g, rows=n, rss=products.rss, ops=self._ops)

    def system_from_slices(
        self, slices: Iterable[JacobianSlice], rows: int, params: int
    ) -> LinearSystem:
        cn = self._cn
        # Each slice is attached zero-copy; writing it into J is a copy task inside
        # Legate, and J is one array that Legate partitions by rows.
        jac, res = gather_slices(
            slices, rows, params, native=self._attach, empty=lambda shape, dt: cn.empty(shape, dt)
        )
        return self.system_from_matrix(jac, res)

    def system_from_matrix(self, jac: Any, res: Any) -> LinearSystem:
        """The system for an explicit J (N × P) and r (N,) already in Legate."""
        return system_from_matrix(jac, res, self._ops)

    # -- damped solves --------------------------------------------------------------------

    def _damping(self, system: LinearSystem, scaling: str) -> Any:
        """The matrix multiplying λ: diag(D) over-determined, I under-determined (cached)."""
        key = self._damping_key
        if key is None or key[0]() is not system or key[1] != scaling:
            if system.underdetermined:
                matrix = self._cn.eye(system.rows, dtype=self._cn.float64)
            else:
                matrix = self._cn.diag(scaling_diagonal(system.diag, scaling, self._cn))
            self._damping_key, self._damping_matrix = (weakref.ref(system), scaling), matrix
        return self._damping_matrix

    def _cholesky_solve(self, matrix: Any, rhs: Any) -> Any | None:
        """x with matrix·x = rhs by float64 Cholesky, or ``None`` when it is not positive
        definite (NaN in the factor shows up later as a non-finite δ)."""
        try:
            lower = self._linalg.cholesky(matrix)
            return self._linalg.cho_solve((lower, True), rhs, check_finite=False)
        except (np.linalg.LinAlgError, self._linalg.LinAlgError):
            return None

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        cn = self._cn
        a: Any = system.a
        g: Any = system.g
        if system.underdetermined:
            check_scaling(scaling)
            u = self._cholesky_solve(a + float(damping) * self._damping(system, scaling), g)
            if u is None:
                return None
            jac: Any = system.jacobian
            delta = (jac.T @ u.astype(jac.dtype)).astype(cn.float64)
            solved = u
        else:
            solved = self._cholesky_solve(a + float(damping) * self._damping(system, scaling), g)
            if solved is None:
                return None
            delta = solved
        # A private host copy: the Legate array may be freed or reused once we return.
        host = np.asarray(delta, dtype=np.float64).copy()
        if not np.all(np.isfinite(host)):
            return None
        return solution(system, solved, torch.from_numpy(host), damping)

    def synchronize(self) -> None:
        """Block until every Legate operation issued so far has finished."""
        self._runtime.issue_execution_fence(block=True)


def create_backend(device: torch.device) -> ArrayBackend:
    """The cuPyNumeric backend (``device``, the model's, is where slices come from; Legate
    holds its own processors). Starts Legate if it is not running yet."""
    return CupynumericBackend()
