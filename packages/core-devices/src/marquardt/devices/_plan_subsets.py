"""The plan of a step on parameter subsets, when neither strategy fits the machine:
``LMA(params_per_step=k)`` forms ``k`` columns of ``J`` a step and solves a ``k × k``
system (the arithmetic is in ``_planner.py``'s docstring): `subset_size`."""

from __future__ import annotations

import math

from ._discovery import GpuInfo
from ._memory import HostMemory
from ._plan_split import first_device, kept_besides, slice_lines, verdict
from ._plan_types import SLICE_FACTOR, Plan, fmt_bytes

__all__ = ["SUBSET_ROUNDING", "plan_subsets", "subset_size"]

#: Subset sizes are rounded down to a multiple of this many parameters.
SUBSET_ROUNDING = 64


def subset_size(usable: float, params: int, item: int) -> int:
    """The largest parameter subset ``k`` whose ``k × k`` system fits the memory.

    ``k`` is the largest count (a multiple of ``SUBSET_ROUNDING`` from
    ``2·SUBSET_ROUNDING`` up, at most ``P``) whose ``3·8·k²`` system bytes take at most
    half of ``usable`` after ``P·(2b + 8)`` (θ, its backup, the scattered δ).

    Arguments:
        usable: the bytes the device may use.
        params: ``P``, the model's parameter count.
        item: ``b``, bytes per element of the parameters' dtype.

    Returns:
        ``k``; 0 when not even one parameter fits.
    """
    room = (usable - params * (2 * item + 8)) / 2
    if room < 24:
        return 0
    k = min(params, math.isqrt(int(room // 24)))
    return k - k % SUBSET_ROUNDING if k >= 2 * SUBSET_ROUNDING else k


def plan_subsets(
    full: Plan, visible: list[GpuInfo], host: HostMemory, keep: float, item: int
) -> Plan:
    """Parameter subsets per step, solved on the first model device (torch) or in RAM."""
    params, batch, outputs = full.params, full.batch, full.outputs
    lines = list(full.lines)
    usable, where = first_device(visible, host, keep)
    k = subset_size(usable, params, item)
    fixed = params * (2 * item + 8)
    system = 24 * k * k
    lines.append(
        f"neither strategy fits: parameter subsets per step (LMA(params_per_step=k)). "
        f"theta, its backup and delta: P x ({2 * item} + 8) = {fmt_bytes(fixed)}; the k x k system: "
        f"3 x k^2 x 8 (JtJ_S, the float64 matrix and its damped copy), at most half of the "
        f"{fmt_bytes(usable - fixed)} left {where} -> k = {k}"
        + (f" (a multiple of {SUBSET_ROUNDING})" if k >= 2 * SUBSET_ROUNDING else "")
        + f", {fmt_bytes(system)}."
    )
    devices = max(1, len(visible))
    per_sample = SLICE_FACTOR * outputs * max(k, 1) * item
    size, slice_fits = slice_lines(
        usable - fixed - system, per_sample, batch, devices, kept_besides(system, 0), lines, "k"
    )
    fits = k >= 1 and slice_fits
    lines.append(verdict(fits, where, fixed + system + size * per_sample, usable))
    return Plan(
        params=params, batch=batch, outputs=outputs, dtype=full.dtype, rows=full.rows,
        strategy="subsets", jacobian_bytes=full.jacobian_bytes, normal_bytes=full.normal_bytes,
        solver_bytes=system, backend="torch" if visible else "numpy", legate_gpus=0,
        model_devices=tuple(f"cuda:{g.ordinal}" for g in visible) or ("cpu",),
        slice_size=size, slice_bytes=size * per_sample, fits=fits, fbmem_mib=None,
        sysmem_mib=None, lines=tuple(lines), params_per_step=k,
    )  # fmt: skip
