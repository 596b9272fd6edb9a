"""The torch backend: assemble and solve on the model's own device, no transfer.

Assembly (see ``base``): over-determined A = JᵀJ/N, g = Jᵀr/N; under-determined
B = JJᵀ/N, g = r/N with δ = Jᵀu. The products arrive from the Jacobian engine on the model
device and stay there; A, g and D are held in float64 (P × P is small next to J), and each
damped solve is ``torch.linalg.cholesky_ex`` (which reports failure through ``info``
instead of raising) followed by ``torch.cholesky_solve``. A failed factorisation or a
non-finite δ returns ``None``: a rejected attempt. This is the best choice on one GPU, and
on a CPU machine without Legate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from .._scaling import marquardt_floor
from .base import (
    ArrayBackend,
    ArrayOps,
    LinearSystem,
    Solution,
    gather_slices,
    normal_system,
    solution,
    system_from_matrix,
)

if TYPE_CHECKING:
    from marquardt.jacobian import JacobianSlice, NormalProducts

__all__ = ["TorchBackend", "create_backend"]

_TORCH_OPS = ArrayOps(
    float64=lambda x: x.to(torch.float64),
    column_squares=lambda j: (j * j).sum(dim=0, dtype=torch.float64),
    diagonal=lambda a: torch.diagonal(a).clone(),
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

    def _scaling(self, diag: torch.Tensor, scaling: str) -> torch.Tensor:
        if scaling == "identity":
            return torch.ones_like(diag)
        if scaling == "marquardt":
            finite = torch.isfinite(diag)
            top = float(diag[finite].max()) if bool(finite.any()) else 0.0
            floor = marquardt_floor(top)
            return torch.where(finite, diag, torch.full_like(diag, floor)).clamp_min(floor)
        raise ValueError(
            f"scaling must be 'identity' or 'marquardt', got {scaling!r}. "
            "HINT: pass one of those to LMA(scaling=...)."
        )

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        a: torch.Tensor = system.a
        g: torch.Tensor = system.g
        if system.underdetermined:
            m = a + damping * torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
            u = _cholesky_solve(m, g)
            if u is None:
                return None
            jac = system.jacobian
            assert isinstance(jac, torch.Tensor)
            delta = (jac.T @ u.to(jac.dtype)).to(torch.float64)
            if not bool(torch.isfinite(delta).all()):
                return None
            solved = u
        else:
            m = a.clone()
            m.diagonal().add_(self._scaling(system.diag, scaling), alpha=float(damping))
            solved_or_none = _cholesky_solve(m, g)
            if solved_or_none is None:
                return None
            delta = solved = solved_or_none
        return solution(system, solved, delta.to("cpu"), damping)

    def synchronize(self) -> None:
        """Wait for queued CUDA work on this device (nothing to do on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _cholesky_solve(matrix: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor | None:
    """x with matrix·x = rhs (float64 Cholesky), or ``None`` if not positive definite or
    x is not finite.

    Only the diagonal and rhs are scanned for inf/NaN (O(n)): LAPACK's potrf stops with
    info > 0 at the first pivot that is not positive, and a non-finite off-diagonal entry
    of a matrix with a finite diagonal reaches some pivot as NaN or a negative number.
    """
    if not bool(torch.isfinite(matrix.diagonal()).all()) or not bool(torch.isfinite(rhs).all()):
        return None
    lower, info = torch.linalg.cholesky_ex(matrix)
    if int(info) != 0:
        return None
    x = torch.cholesky_solve(rhs.reshape(-1, 1), lower).reshape(-1)
    if not bool(torch.isfinite(x).all()):
        return None
    return x


def create_backend(device: torch.device) -> ArrayBackend:
    """The torch backend on ``device`` (the model's device)."""
    return TorchBackend(device)
