"""The NumPy backend: the CPU reference for assembling and solving the LM system.

Assembly (see ``base``): over-determined A = JᵀJ/N, g = Jᵀr/N; under-determined
B = JJᵀ/N, g = r/N with δ = Jᵀu. J is assembled in the slices' dtype (``J.T @ J`` lets
NumPy call the BLAS symmetric rank-k update), A and g are then kept in float64. Each
damped solve factorises A + λD by Cholesky in float64 (``scipy.linalg.cho_factor`` when
SciPy is installed, else ``numpy.linalg.cholesky`` and two triangular solves); a failed
factorisation or a non-finite δ returns ``None`` (a rejected attempt, never an exception).
BLAS runs on one thread here (``blas_threads.py``): its pool would fight torch's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from marquardt.jacobian import JacobianSlice, NormalProducts

from .base import ArrayBackend, LinearSystem, Solution
from .blas_threads import one_blas_thread
from .scaling import scaling_diagonal_numpy
from .systems import ArrayOps, gather_slices, normal_system, solution, system_from_matrix

__all__ = ["NumpyBackend", "cholesky_solve_numpy", "create_backend"]

F64 = np.ndarray[Any, np.dtype[np.float64]]


def _to_numpy(tensor: torch.Tensor) -> np.ndarray[Any, np.dtype[Any]]:
    """A torch tensor as a NumPy array on the host (zero-copy for CPU tensors)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t.numpy()


def cholesky_solve_numpy(matrix: F64, rhs: F64, *, overwrite: bool = False) -> F64 | None:
    """x with matrix·x = rhs by Cholesky in float64, or ``None`` when the matrix is not
    (numerically) positive definite or x is not finite. With ``overwrite``, SciPy factorises
    ``matrix`` in place (a damped copy the caller no longer needs): no second S × S array."""
    # O(n) scan only: a non-finite off-diagonal entry with a finite diagonal makes some
    # pivot NaN or negative, which the factorisation reports.
    if not np.all(np.isfinite(np.diagonal(matrix))) or not np.all(np.isfinite(rhs)):
        return None
    try:
        from scipy.linalg import cho_factor, cho_solve
    except ImportError:  # SciPy is optional: plain NumPy below
        cho_factor = None
    try:
        if cho_factor is not None:
            # LAPACK works in column order: a C-ordered array would be copied first, so the
            # factor takes its transpose in Fortran order, whose upper triangle is the
            # matrix's lower one (the triangle read otherwise: the same digits).
            if overwrite and matrix.flags.c_contiguous:
                factor = cho_factor(matrix.T, lower=False, overwrite_a=True, check_finite=False)
            else:
                factor = cho_factor(matrix, lower=True, check_finite=False)
            x = cho_solve(factor, rhs, check_finite=False)
        else:
            lower: F64 = np.asarray(np.linalg.cholesky(matrix), dtype=np.float64)
            y = _forward_substitution(lower, rhs)
            x = _forward_substitution(lower.T[::-1, ::-1], y[::-1])[::-1]
    except (np.linalg.LinAlgError, ValueError):
        return None
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        return None
    return x


def _forward_substitution(lower: F64, rhs: F64) -> F64:
    """Solve L y = b for lower-triangular L (the NumPy-only fallback path)."""
    n = rhs.shape[0]
    y = np.empty(n, dtype=np.float64)
    for i in range(n):
        y[i] = (rhs[i] - lower[i, :i] @ y[:i]) / lower[i, i]
    return y


class NumpyBackend:
    """Assemble and solve in NumPy on the host. See the module docstring."""

    name = "numpy"

    def system_from_products(self, products: NormalProducts) -> LinearSystem:
        n = int(products.rows)
        a = _to_numpy(products.jtj).astype(np.float64) / n
        g = _to_numpy(products.jtr).astype(np.float64).reshape(-1) / n
        return normal_system(a, g, rows=n, rss=products.rss, ops=_NUMPY_OPS)

    def system_from_slices(
        self, slices: Iterable[JacobianSlice], rows: int, params: int
    ) -> LinearSystem:
        jac, res = gather_slices(
            slices, rows, params, native=_to_numpy, empty=lambda shape, dt: np.empty(shape, dt)
        )
        with one_blas_thread():
            return system_from_matrix(jac, res, _NUMPY_OPS)

    def jacobian_buffers(
        self, rows: int, params: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """J (rows × params) and r (rows,) in host memory, shared with NumPy (zero-copy)."""
        return torch.empty(rows, params, dtype=dtype), torch.empty(rows, dtype=dtype)

    def system_from_jacobian(self, jacobian: torch.Tensor, residuals: torch.Tensor) -> LinearSystem:
        """The system from the filled buffers of ``jacobian_buffers``."""
        with one_blas_thread():
            return system_from_matrix(_to_numpy(jacobian), _to_numpy(residuals), _NUMPY_OPS)

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        with one_blas_thread():
            return self._solve(system, damping, scaling)

    def _solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        a: F64 = system.a
        g: F64 = system.g
        if system.underdetermined:
            m = a.copy()
            m[np.diag_indices_from(m)] += damping
            u = cholesky_solve_numpy(m, g, overwrite=True)
            if u is None:
                return None
            jac = system.jacobian
            assert jac is not None
            delta = np.asarray(jac.T @ u.astype(jac.dtype), dtype=np.float64)
            if not np.all(np.isfinite(delta)):
                return None
            solved = u
        else:
            d = system.scale(scaling, scaling_diagonal_numpy)
            m = a.copy()
            m[np.diag_indices_from(m)] += damping * d
            delta_or_none = cholesky_solve_numpy(m, g, overwrite=True)
            if delta_or_none is None:
                return None
            delta = solved = delta_or_none
        return solution(system, solved, torch.from_numpy(delta), damping)

    def synchronize(self) -> None:
        """NumPy is synchronous: nothing to wait for."""


_NUMPY_OPS = ArrayOps(
    float64=lambda x: np.asarray(x, dtype=np.float64),
    column_squares=lambda j: np.einsum("ij,ij->j", j, j, dtype=np.float64),
    diagonal=lambda a: np.diagonal(a).copy(),
)


def create_backend(device: torch.device) -> ArrayBackend:
    """The NumPy backend (``device`` is ignored: NumPy runs on the host)."""
    return NumpyBackend()
