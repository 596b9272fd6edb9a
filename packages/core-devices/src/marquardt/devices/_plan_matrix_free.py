"""The plan of a matrix-free step (``LMA(strategy="matrix_free")``: conjugate gradients on
products JᵀJv, no matrix formed), recommended where it is predicted faster than the dense
step, or where the dense step does not fit and the matrix-free one does, instead of
parameter subsets: `plan_matrix_free`.

Its memory is linear in ``P``: ``θ``, its backup and δ (``P·(2b + 8)``) and
``MATRIX_FREE_VECTORS_HELD`` float64 P-vectors (CG's vectors, the diagonal probes, the
rank-16 Nyström sketch), besides the model's activations of one chunk, which the engine
sizes itself from a probe of the model.
"""

from __future__ import annotations

from ._discovery import GpuInfo
from ._machine import MachineConstants
from ._memory import HostMemory
from ._plan_split import first_device, verdict
from ._plan_types import Plan, fmt_bytes
from ._step_time import DENSE_STEP_WORTH, StepTime, step_seconds

__all__ = [
    "CG_VECTORS",
    "DEFAULT_PROBES",
    "DEFAULT_RANK",
    "MATRIX_FREE_VECTORS_HELD",
    "SKETCH_VECTORS",
    "matrix_free_bytes",
    "plan_matrix_free",
]

#: Float64 P-vectors conjugate gradients hold at once: x, r, z, p, Ap, Ax, g, the estimate
#: d̂ of diag(JᵀJ)/N, D, the preconditioner's M and the warm start (the solver's
#: ``CG_VECTORS``, which its tests hold equal to this).
CG_VECTORS = 11
#: Hutchinson probes of diag(JᵀJ) a step draws by default, one P-vector Jᵀz each
#: (``TruncatedCG.probes``).
DEFAULT_PROBES = 1
#: Float64 P-vectors per unit of the Nyström rank while the sketch is formed: the test
#: matrix, its products, the factor and the basis kept (the solver's ``SKETCH_VECTORS``).
SKETCH_VECTORS = 4
#: The Nyström sketch's rank by default (``TruncatedCG.rank``).
DEFAULT_RANK = 16
#: Float64 P-vectors a matrix-free step holds with the default options.
MATRIX_FREE_VECTORS_HELD = CG_VECTORS + DEFAULT_PROBES + SKETCH_VECTORS * DEFAULT_RANK


def matrix_free_bytes(params: int, item: int) -> int:
    """The bytes of a matrix-free step besides one chunk's activations."""
    return params * (2 * item + 8) + 8 * params * MATRIX_FREE_VECTORS_HELD


def plan_matrix_free(
    full: Plan,
    visible: list[GpuInfo],
    host: HostMemory,
    keep: float,
    item: int,
    times: tuple[StepTime, StepTime],
) -> Plan:
    """The matrix-free plan of ``full``'s problem on the first model device (or in RAM);
    ``times``: the predicted steps of the dense strategy and the matrix-free one."""
    dense, free = times
    lines = list(full.lines)
    usable, where = first_device(visible, host, keep)
    need = matrix_free_bytes(full.params, item)
    why = (
        "the dense step does not fit"
        if not full.fits
        else f"{dense.strategy}'s step is slow, predicted over {DENSE_STEP_WORTH:g} times slower"
    )
    lines.append(
        f"matrix-free steps (LMA(strategy='matrix_free'): CG on products JtJv): {why}. "
        f"theta, its backup and delta: P x ({2 * item} + 8); CG vectors, probes and the "
        f"Nystrom sketch: {MATRIX_FREE_VECTORS_HELD} x P x 8; together {fmt_bytes(need)}, "
        "besides one chunk's activations (sized by the engine)."
    )
    devices = max(1, len(visible))
    size = max(1, full.batch // devices)
    fits = need <= usable
    lines.append(verdict(fits, where, need, usable))
    return Plan(
        params=full.params, batch=full.batch, outputs=full.outputs, dtype=full.dtype,
        rows=full.rows, strategy="matrix_free", jacobian_bytes=full.jacobian_bytes,
        normal_bytes=full.normal_bytes, solver_bytes=need - full.params * (2 * item + 8),
        backend="torch" if visible else "numpy", legate_gpus=0,
        model_devices=tuple(f"cuda:{g.ordinal}" for g in visible) or ("cpu",),
        slice_size=size, slice_bytes=0, fits=fits, fbmem_mib=None, sysmem_mib=None,
        lines=tuple(lines), step_seconds=free.seconds,
    )  # fmt: skip


def predicted(
    dense: str, rows: int, params: int, item: int, machine: MachineConstants
) -> tuple[StepTime, StepTime]:
    """The predicted steps of ``dense`` and of the matrix-free strategy."""
    return (
        step_seconds(dense, rows, params, item, machine),
        step_seconds("matrix_free", rows, params, item, machine),
    )
