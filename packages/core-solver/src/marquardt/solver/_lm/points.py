"""What ``LMA`` checks when its residual differentiates the model by its inputs.

A ``marquardt.jacobian.PointResidual`` (physics-informed networks: ``−Δu_θ − f`` at
collocation points, ``u_θ − g`` on the boundary) goes to the Jacobian engine unchanged,
and every part of the step (damping, scaling, both strategies, ``process_group``,
``params_per_step``, ``covariance``) works on its rows as on any others. Two options do
not apply, because they are functions of the model's outputs: ``loss_fn(outputs,
targets)`` and ``robust_loss`` (which rewrites ``residual_fn(outputs, targets)``). The
model must be in the residual's dtype (float64 unless the residual says otherwise: the
``marquardt.jacobian`` documentation of ``PointResidual`` says why); all three are checked
here, before anything is built.
"""

from __future__ import annotations

from torch import nn

from marquardt.jacobian import PointResidual

from .._errors import SolverConfigError, message

__all__ = ["check_point_residual"]


def check_point_residual(
    residual: object, model: nn.Module, *, loss_fn: object, robust_loss: object
) -> None:
    """Refuse, before any work, the options a ``PointResidual`` cannot take."""
    if not isinstance(residual, PointResidual):
        return
    for name, value in (("loss_fn", loss_fn), ("robust_loss", robust_loss)):
        if value is not None:
            raise SolverConfigError(
                message(
                    f"LMA({name}=...) with {residual!r} was requested",
                    f"{name} works on the model's outputs, and this residual's rows are not "
                    "functions of them",
                    f"drop {name}; weight the groups instead (ResidualGroup(name, fn, weight))",
                )
            )
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if dtypes and dtypes != {residual.dtype}:
        found = ", ".join(sorted(str(d) for d in dtypes))
        raise SolverConfigError(
            message(
                f"a model in {residual.dtype} for {residual!r} was expected",
                f"its trainable parameters are {found}",
                f"call model.to({residual.dtype}) first (float64 keeps the digits that −Δu − f "
                "and JᵀJ cancel), or build PointResidual(..., dtype=...) in the model's dtype",
            )
        )
