"""Cpufit (the CPU half of Gpufit) through its C interface, by ctypes.

A Cpufit build (made by the user from Gpufit's sources) is two shared libraries,
``libcpufit_float.so`` and ``libcpufit_double.so`` (REAL = float or double in Gpufit's ``definitions.h``). This module
calls their ``cpufit(...)``: M fits of N points, the model and estimator by id (Gpufit's
``constants.h``: GAUSS_2D = 1, LSE = 0), REAL arrays in, REAL and int arrays out. Cpufit
runs its fits one after the other on the calling thread.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["GAUSS_2D", "LSE", "Cpufit", "CpufitResult", "load"]

#: Gpufit's ``ModelID.GAUSS_2D``: a·exp(−((x − x₀)² + (y − y₀)²)/(2w²)) + b on a square
#: of √N × √N pixels, x the fast (column) index; parameters (a, x₀, y₀, w, b).
GAUSS_2D = 1
#: Gpufit's ``EstimatorID.LSE``: least squares (MLE = 1 is Poisson maximum likelihood).
LSE = 0


@dataclass(frozen=True)
class CpufitResult:
    """Cpufit's outputs: parameters (M, P), states (0 converged, 1 max iterations,
    2 singular Hessian, 3 negative curvature), χ² and iterations per fit."""

    parameters: np.ndarray
    states: np.ndarray
    chi_squares: np.ndarray
    iterations: np.ndarray


class Cpufit:
    """One Cpufit library; ``dtype`` is its REAL (float32 or float64)."""

    def __init__(self, path: str | Path, dtype: type[np.floating]) -> None:
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self._lib = ctypes.CDLL(str(self.path))
        real = ctypes.c_float if self.dtype == np.float32 else ctypes.c_double
        pointer, ints = ctypes.POINTER(real), ctypes.POINTER(ctypes.c_int)
        self._fit = self._lib.cpufit
        self._fit.restype = ctypes.c_int
        self._fit.argtypes = [
            ctypes.c_size_t,  # n_fits
            ctypes.c_size_t,  # n_points
            pointer,  # data
            pointer,  # weights (NULL: all 1)
            ctypes.c_int,  # model_id
            pointer,  # initial_parameters
            real,  # tolerance
            ctypes.c_int,  # max_n_iterations
            ints,  # parameters_to_fit
            ctypes.c_int,  # estimator_id
            ctypes.c_size_t,  # user_info_size
            ctypes.c_char_p,  # user_info
            pointer,  # output_parameters
            ints,  # output_states
            pointer,  # output_chi_squares
            ints,  # output_n_iterations
        ]
        self._error = self._lib.cpufit_get_last_error
        self._error.restype = ctypes.c_char_p
        self._real = real

    def fit(
        self,
        data: np.ndarray,
        p0: np.ndarray,
        *,
        tolerance: float = 1e-4,
        max_iterations: int = 10,
        model_id: int = GAUSS_2D,
        estimator_id: int = LSE,
    ) -> CpufitResult:
        """Fit every row of ``data`` (M, N) from the rows of ``p0`` (M, P)."""
        data = np.ascontiguousarray(data, dtype=self.dtype)
        start = np.ascontiguousarray(p0, dtype=self.dtype)
        fits, points = data.shape
        params = start.shape[1]
        out = np.empty_like(start)
        states = np.empty(fits, dtype=np.intc)
        chi = np.empty(fits, dtype=self.dtype)
        iterations = np.empty(fits, dtype=np.intc)
        to_fit = np.ones(params, dtype=np.intc)

        def ptr(a: np.ndarray, kind: type) -> object:
            return a.ctypes.data_as(ctypes.POINTER(kind))

        status = self._fit(
            fits,
            points,
            ptr(data, self._real),
            None,
            model_id,
            ptr(start, self._real),
            self._real(tolerance),
            max_iterations,
            ptr(to_fit, ctypes.c_int),
            estimator_id,
            0,
            None,
            ptr(out, self._real),
            ptr(states, ctypes.c_int),
            ptr(chi, self._real),
            ptr(iterations, ctypes.c_int),
        )
        if status != 0:
            raise RuntimeError(f"cpufit failed: {self._error().decode(errors='replace')}")
        return CpufitResult(out, states, chi, iterations)


def load(float_library: str | Path) -> dict[str, Cpufit]:
    """The float library at ``float_library`` and, where it lies beside it, the double one
    (``libcpufit_double.so``), by dtype name."""
    path = Path(float_library)
    if not path.is_file():
        raise FileNotFoundError(
            f"no Cpufit library at {path}. HINT: build Cpufit as Gpufit's documentation "
            "says and pass the path of its libcpufit_float.so"
        )
    found = {"float32": Cpufit(path, np.float32)}
    double = path.with_name("libcpufit_double.so")
    if double.is_file():
        found["float64"] = Cpufit(double, np.float64)
    return found
