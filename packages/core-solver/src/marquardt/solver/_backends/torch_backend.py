"""The torch backend: assemble and solve on the model's own device, no transfer.

Assembly (see ``base``): over-determined A = JᵀJ/N, g = Jᵀr/N; under-determined
B = JJᵀ/N, g = r/N with δ = Jᵀu. The products arrive from the Jacobian engine on the model
device and stay there; A, g and D are held in float64 (P × P is small next to J; D is built
once per system), and each damped solve is ``torch.linalg.cholesky_ex`` (which reports
failure through ``info`` instead of raising) followed by two triangular solves. δ stays
on the device; a failed factorisation or a non-finite δ is reported in the solution's
``status``, read by the caller with the trial loss: a rejected attempt. An explicit J is
written by the engine straight into this backend's buffer, and JJᵀ (or JᵀJ) is a
symmetric rank-k update on the CPU. This is the best choice on one GPU, and on a CPU
machine without Legate.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from marquardt.jacobian import JacobianSlice, NormalProducts

from .base import FAILED_CHOLESKY, FAILED_NON_FINITE, ArrayBackend, LinearSystem, Solution
from .scaling import scaling_diagonal_torch
from .systems import ArrayOps, gather_slices, normal_system, system_from_matrix

__all__ = ["TorchBackend", "create_backend", "factor_solve"]

#: Rows of J per block of the one-pass column terms: a block (≤ 4 MiB at P = 16k in
#: float32) is read once for its squares and its share of Jᵀr while it is in cache.
_TERM_ROWS = 64


def _gram(m: torch.Tensor) -> torch.Tensor:
    """MᵀM in float64, formed in M's dtype. On the CPU through NumPy's ``M.T @ M``, which
    calls the BLAS symmetric rank-k update (half the flops of torch's general ``mm``, which
    has no ``syrk``); on a GPU with ``mm``."""
    if m.device.type == "cpu" and m.dtype in (torch.float32, torch.float64):
        a = m.detach().numpy()
        return torch.from_numpy(np.matmul(a.T, a)).to(torch.float64)
    return (m.T @ m).to(torch.float64)


def _column_terms(jac: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σᵢ Jᵢⱼ², Jᵀr) in float64, from one pass over J in row blocks."""
    p = int(jac.shape[1])
    squares = torch.zeros(p, dtype=torch.float64, device=jac.device)
    jtr = torch.zeros(p, dtype=torch.float64, device=jac.device)
    r = res.reshape(-1)
    for lo in range(0, int(jac.shape[0]), _TERM_ROWS):
        block = jac[lo : lo + _TERM_ROWS]
        squares += (block * block).sum(dim=0, dtype=torch.float64)
        jtr += (block.T @ r[lo : lo + _TERM_ROWS]).to(torch.float64)
    return squares, jtr


_TORCH_OPS = ArrayOps(
    float64=lambda x: x.to(torch.float64),
    column_squares=lambda j: (j * j).sum(dim=0, dtype=torch.float64),
    diagonal=lambda a: torch.diagonal(a).clone(),
    gram=_gram,
    column_terms=_column_terms,
)


class TorchBackend:
    """Assemble and solve with torch on ``device``. See the module docstring."""

    name = "torch"

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    def system_from_products(self, products: NormalProducts) -> LinearSystem:
        n = int(products.rows)
        # One new float64 copy, divided in place (P × P: cheap next to forming JᵀJ).
        a = products.jtj.detach().to(self.device, torch.float64, copy=True).div_(n)
        g = products.jtr.detach().to(self.device, torch.float64).reshape(-1) / n
        return normal_system(a, g, rows=n, rss=products.rss, ops=_TORCH_OPS)

    def jacobian_buffers(
        self, rows: int, params: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """J (rows × params) and r (rows,) on this device, for the engine to fill."""
        return (
            torch.empty(rows, params, dtype=dtype, device=self.device),
            torch.empty(rows, dtype=dtype, device=self.device),
        )

    def system_from_jacobian(self, jacobian: torch.Tensor, residuals: torch.Tensor) -> LinearSystem:
        """The system from the filled buffers of ``jacobian_buffers``."""
        return self.system_from_matrix(jacobian, residuals)

    def system_from_slices(
        self, slices: Iterable[JacobianSlice], rows: int, params: int
    ) -> LinearSystem:
        device = self.device
        jac, res = gather_slices(
            slices,
            rows,
            params,
            native=lambda t: t.detach().to(device),
            empty=lambda shape, dt: torch.empty(shape, dtype=dt, device=device),
        )
        return self.system_from_matrix(jac, res)

    def system_from_matrix(self, jac: torch.Tensor, res: torch.Tensor) -> LinearSystem:
        """The system for an explicit J (N × P) and r (N,) on this device."""
        return system_from_matrix(jac, res, _TORCH_OPS)

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        """δ for λ = ``damping``, with everything left on the device (see ``Solution``).

        Nothing here waits for the device: the factorisation's ``info``, the finiteness of
        δ and the model terms come back as 0-dim tensors that the caller reads with the
        trial loss.
        """
        a: torch.Tensor = system.a
        g: torch.Tensor = system.g
        d: torch.Tensor = system.scale(scaling, scaling_diagonal_torch)
        m = a.clone()
        if system.underdetermined:
            m.diagonal().add_(float(damping))  # D = I for (JJᵀ/N + λI) u = r/N
        else:
            # λ·D rounded before the sum (no fused multiply-add), as the tensor attempt forms it.
            m.diagonal().add_(d * float(damping))
        jac = system.jacobian if system.underdetermined else None
        delta, gradient_dot, curvature, status = factor_solve(
            m, a, g, jacobian=jac, rows=system.rows
        )
        return Solution(
            delta=delta,
            gradient_dot=gradient_dot,
            curvature=curvature,
            damping=float(damping),
            status=status,
        )

    def synchronize(self) -> None:
        """Wait for queued CUDA work on this device (nothing to do on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def factor_solve(
    m: torch.Tensor,
    a: torch.Tensor,
    g: torch.Tensor,
    *,
    jacobian: torch.Tensor | None,
    rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """δ, δᵀg, δᵀAδ and the solve's status from the damped matrix ``m`` = A + λD.

    The float64 Cholesky factorisation of ``m`` (``cholesky_ex``, which reports failure
    through ``info`` instead of raising) and two triangular solves give the solution of
    m·x = g; under-determined (``jacobian`` given), x is u and δ = Jᵀu. Nothing is read
    back: the status (0, ``FAILED_CHOLESKY`` or ``FAILED_NON_FINITE``) is a 0-dim tensor.
    ``m`` is factorised in place: the step holds two matrices (the system and this one),
    not three, and the factor's row-major layout gives both callers the same triangular
    solves. The eager backend and the tensor attempt (``_lm.attempt.pure``) share it.

    Arguments:
        m: A + λD (P × P, or N × N under-determined), float64.
        a: the undamped A (JᵀJ/N, or JJᵀ/N).
        g: the right-hand side (Jᵀr/N, or r/N).
        jacobian: J when the system is under-determined, else None.
        rows: N.

    Returns:
        (δ float64 (P,), δᵀg, δᵀAδ, status), all tensors on ``m``'s device.
    """
    # A non-finite diagonal can pass the factorisation (an infinite pivot): refuse it
    # as LAPACK refuses a pivot that is not positive. Read before m is overwritten.
    diagonal_finite = torch.isfinite(m.diagonal()).all()
    info = torch.empty((), dtype=torch.int32, device=m.device)
    lower, info = torch.linalg.cholesky_ex(m, out=(m, info))
    # Two triangular solves: on the CPU torch.cholesky_solve copies the factor first,
    # several times slower at large P.
    half = torch.linalg.solve_triangular(lower, g.reshape(-1, 1), upper=False)
    solved = torch.linalg.solve_triangular(lower.mT, half, upper=True).reshape(-1)
    if jacobian is not None:
        delta = (jacobian.T @ solved.to(jacobian.dtype)).to(torch.float64)
        bu = a @ solved
        gradient_dot, curvature = rows * (bu @ g), rows * (bu @ bu)
    else:
        delta = solved
        gradient_dot, curvature = solved @ g, solved @ (a @ solved)
    finite = torch.isfinite(delta).all() & torch.isfinite(gradient_dot) & torch.isfinite(curvature)
    not_factored = (info != 0) | ~diagonal_finite
    # Filled on the device: torch.tensor(value, device=cuda) would copy from the host,
    # and on CUDA every such copy waits for the queue.
    zero = torch.zeros((), dtype=torch.float64, device=m.device)
    status = torch.where(
        not_factored,
        zero + FAILED_CHOLESKY,
        torch.where(finite, zero, zero + FAILED_NON_FINITE),
    )
    return delta, gradient_dot, curvature, status


def create_backend(device: torch.device) -> ArrayBackend:
    """The torch backend on ``device`` (the model's device)."""
    return TorchBackend(device)
