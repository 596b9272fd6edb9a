"""The floor of an LM step: the Gram product of J and one float64 Cholesky solve.

Every LM step on ``R`` residual rows and ``P`` parameters forms the Gram matrix of the
smaller side of its Jacobian ``J`` (R × P) and factorises it (Marquardt 1963; Gavin's LM
notes, §4): ``JᵀJ`` (P × P, R·P² multiply-adds, half of them with a symmetric rank-k
update) when ``R ≥ P``, ``JJᵀ`` (R × R, R²·P) when ``R < P``, the under-determined form
``δ = Jᵀ(JJᵀ + λI)⁻¹r``. The floor is the fastest kernel found for that product on the
device, plus one float64 Cholesky factorisation and solve of the S × S system
(S = min(R, P)): the work no LM step on that shape can avoid.

Kernels tried. CPU: torch ``mm`` (a full GEMM); NumPy ``A.T @ A`` (its BLAS's ``syrk``);
SciPy's ``ssyrk``; the ``ssyrk`` of the MKL inside torch's CPU library, where exported.
CUDA: torch ``mm``; CuPy's ``cublas.syrk`` (cuBLAS ``ssyrk``), where CuPy is installed.
A kernel is used only after it reproduced the product on a small matrix of the same
orientation. ``floor_seconds(jac, ...)`` measures on a given ``J``; ``random_floor`` on
a random float32 ``J`` of a shape, freed before the factorisation so that the largest
shapes need no more memory than an LM step does.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common as c
import numpy as np
import torch

Kernel = Callable[[], object]


def gram_name(jac: torch.Tensor) -> str:
    """``"JᵀJ"`` when J has at least as many rows as columns, else ``"JJᵀ"``."""
    rows, params = jac.shape
    return "JᵀJ" if rows >= params else "JJᵀ"


def _reference(jac: torch.Tensor) -> torch.Tensor:
    return jac.T @ jac if gram_name(jac) == "JᵀJ" else jac @ jac.T


def _scipy_ssyrk(jac: torch.Tensor) -> Kernel | None:
    try:
        from scipy.linalg import blas
    except ImportError:
        return None
    a = jac.numpy()
    if gram_name(jac) == "JᵀJ":
        # With a Fortran-ordered R × P matrix, trans=1 forms AᵀA (upper triangle only).
        af = np.asfortranarray(a)
        return lambda: blas.ssyrk(1.0, af, trans=1, lower=0)
    # a.T is a Fortran-ordered P × R view of the same memory: trans=1 forms (aᵀ)ᵀaᵀ = JJᵀ.
    at = a.T
    return lambda: blas.ssyrk(1.0, at, trans=1, lower=0)


def _mkl_ssyrk(jac: torch.Tensor) -> Kernel | None:
    """BLAS ``ssyrk`` of the MKL inside torch's CPU library, when that library exports it.

    torch has no symmetric rank-k product of its own, but its x86 wheels carry MKL, whose
    ``ssyrk`` forms one triangle of the Gram matrix in about half the time of a full
    ``mm``. It is reached here through ``ctypes`` only to measure the floor; no library
    code uses it. The row-major ``R × P`` matrix is read as a column-major ``P × R`` one
    ``A`` (lda = P), so ``A Aᵀ`` (trans "N") is ``JᵀJ`` and ``AᵀA`` (trans "T") is ``JJᵀ``;
    64-bit integers are passed (read correctly by LP64 and ILP64 interfaces alike on
    little-endian machines for sizes below 2³¹).
    """
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        fn = ctypes.CDLL(str(path)).mkl_blas_ssyrk
    except (OSError, AttributeError):
        return None
    rows, p = jac.shape
    gram_rows = gram_name(jac) == "JJᵀ"
    n, k = (rows, p) if gram_rows else (p, rows)
    out = torch.zeros(n, n)
    args: list[Any] = [
        ctypes.c_char(b"U"),
        ctypes.c_char(b"T" if gram_rows else b"N"),
        ctypes.c_int64(n),
        ctypes.c_int64(k),
        ctypes.c_float(1.0),
    ]
    lda, beta, ldc = ctypes.c_int64(p), ctypes.c_float(0.0), ctypes.c_int64(n)
    ptr_a, ptr_c = ctypes.c_void_p(jac.data_ptr()), ctypes.c_void_p(out.data_ptr())

    def call() -> torch.Tensor:
        fn(
            *(ctypes.byref(a) for a in args),
            ptr_a,
            ctypes.byref(lda),
            ctypes.byref(beta),
            ptr_c,
            ctypes.byref(ldc),
        )
        return out

    return call


def _cupy_syrk(jac: torch.Tensor) -> Kernel | None:
    """cuBLAS ``ssyrk`` through CuPy on the tensor's own memory (no copy of ``J``).

    ``J.T`` is a Fortran-ordered P × R view: trans "N" forms ``(Jᵀ)(Jᵀ)ᵀ = JᵀJ``, trans
    "T" forms ``JJᵀ``; the upper triangle of a preallocated Fortran-ordered output.
    """
    try:
        import cupy
        from cupy import cublas
    except Exception:  # not installed, or no usable CUDA runtime for it
        return None
    a = cupy.asarray(jac.T)
    trans = "N" if gram_name(jac) == "JᵀJ" else "T"
    n = jac.shape[1] if trans == "N" else jac.shape[0]
    out = cupy.empty((n, n), dtype=cupy.float32, order="F")
    return lambda: cublas.syrk(trans, a, out=out, lower=False)


def _as_torch(value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return torch.as_tensor(value, device="cuda")  # a CuPy array (CUDA array interface)


def _checked(make: Callable[[torch.Tensor], Kernel | None], probe: torch.Tensor) -> bool:
    """Whether the kernel built by ``make`` reproduces the product on ``probe``.

    MKL's and cuBLAS's ``ssyrk`` write the upper triangle of a column-major matrix, which
    read row-major is the lower one; NumPy and torch write both. Comparing both triangles
    against the reference after symmetrising covers either.
    """
    try:
        kernel = make(probe)
        if kernel is None:
            return False
        got = _as_torch(kernel()).to(probe.device)
        c.synchronize(probe.device)
    except Exception:
        return False
    ref = _reference(probe)
    upper, lower = torch.triu(got), torch.tril(got)
    sym_upper = upper + upper.T - torch.diag(torch.diagonal(got))
    sym_lower = lower + lower.T - torch.diag(torch.diagonal(got))
    return any(torch.allclose(s, ref, rtol=1e-4, atol=1e-3) for s in (sym_upper, sym_lower))


def gram_kernels(jac: torch.Tensor) -> dict[str, Kernel]:
    """Candidate kernels for the Gram product of ``jac``, each checked on a small matrix."""
    product = gram_name(jac)
    torch_kernel: Kernel = (lambda: jac.T @ jac) if product == "JᵀJ" else (lambda: jac @ jac.T)
    kernels: dict[str, Kernel] = {"torch mm (full GEMM)": torch_kernel}
    # A small matrix of the same orientation, to check each kernel's call before use.
    shape = (96, 40) if product == "JᵀJ" else (40, 96)
    probe = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(jac.device)
    if jac.device.type == "cuda":
        candidates: dict[str, Callable[[torch.Tensor], Kernel | None]] = {
            "cuBLAS ssyrk (CuPy)": _cupy_syrk,
        }
    else:
        a = jac.numpy()
        if product == "JᵀJ":
            kernels["numpy A.T @ A (BLAS syrk)"] = lambda: a.T @ a
        else:
            kernels["numpy A @ A.T (BLAS syrk)"] = lambda: a @ a.T
        candidates = {"MKL ssyrk (torch's MKL)": _mkl_ssyrk, "scipy ssyrk (upper)": _scipy_ssyrk}
    for name, make in candidates.items():
        if _checked(make, probe):
            kernel = make(jac)
            if kernel is not None:
                kernels[name] = kernel
    return kernels


def gram_seconds(
    jac: torch.Tensor, repeats: int, warmup: int = 2, budget: float | None = None
) -> tuple[dict[str, list[float]], torch.Tensor]:
    """Seconds of the timed calls of each Gram kernel on ``jac``, and the product (torch ``mm``).

    ``budget`` caps the timed calls of each kernel (seconds; at least one is timed).
    """
    calls: dict[str, list[float]] = {}
    for name, fn in gram_kernels(jac).items():
        calls[name] = c.time_calls(fn, repeats, warmup=warmup, device=jac.device, budget=budget)
        del fn
    if jac.device.type == "cuda":
        _free_cupy()
    product = _reference(jac)
    c.synchronize(jac.device)
    return calls, product


def cholesky_seconds(
    product: torch.Tensor, rows: int, repeats: int, warmup: int = 2, budget: float | None = None
) -> list[float]:
    """Seconds of float64 Cholesky factorisations and solves of ``product/rows + 1e-3 I``.

    ``product`` is consumed: it is converted to float64 in place of the float32 matrix.
    """
    a64 = product.double()
    del product
    a64 /= rows
    a64.diagonal().add_(1e-3)
    g = torch.randn(a64.shape[0], 1, dtype=torch.float64, device=a64.device)

    def chol() -> torch.Tensor:
        return torch.cholesky_solve(g, torch.linalg.cholesky(a64))

    return c.time_calls(chol, repeats, warmup=warmup, device=a64.device, budget=budget)


def _summary(
    gram: dict[str, list[float]], chol: list[float], product: str, side: int
) -> dict[str, Any]:
    medians = {name: c.median(calls) for name, calls in gram.items()}
    best = min(medians, key=lambda k: medians[k])
    return {
        "product": product,
        "system_size": side,
        "gram_seconds": medians,
        "gram_timed_calls": {name: len(calls) for name, calls in gram.items()},
        "gram_best_kernel": best,
        "cholesky_float64_seconds": c.median(chol),
        "cholesky_timed_calls": len(chol),
        "floor_seconds": medians[best] + c.median(chol),
    }


def floor_seconds(jac: torch.Tensor, repeats: int) -> dict[str, Any]:
    """Median seconds of each Gram kernel on ``jac`` and of a float64 S × S Cholesky solve."""
    gram, product = gram_seconds(jac, repeats, warmup=2)
    chol = cholesky_seconds(product, jac.shape[0], repeats * 3, warmup=2)
    return _summary(gram, chol, gram_name(jac), min(jac.shape))


def random_floor(
    rows: int,
    params: int,
    device: torch.device,
    repeats: int,
    *,
    warmup: int = 1,
    budget: float | None = None,
) -> dict[str, Any]:
    """The floor on a random float32 ``rows × params`` J (seeded), on ``device``.

    J is freed before the factorisation. ``budget`` caps the timed calls of each kernel
    and of the factorisation (seconds; at least one call of each is timed).
    """
    generator = torch.Generator(device=device).manual_seed(c.SEED)
    jac = torch.randn(rows, params, generator=generator, device=device)
    product_name = gram_name(jac)
    gram, product = gram_seconds(jac, repeats, warmup=warmup, budget=budget)
    del jac
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    chol = cholesky_seconds(product, rows, repeats, warmup=warmup, budget=budget)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return _summary(gram, chol, product_name, min(rows, params))


def _free_cupy() -> None:
    """Return CuPy's cached blocks to the device (its pool is separate from torch's)."""
    try:
        import cupy
    except Exception:
        return
    with contextlib.suppress(Exception):  # no CUDA runtime for CuPy here
        cupy.get_default_memory_pool().free_all_blocks()
