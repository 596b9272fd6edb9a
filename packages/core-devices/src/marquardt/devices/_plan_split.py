"""Where a step's memory goes on the machine: the CPU alone, or Legate's GPUs and the
model devices, with the slice size each model device takes and Legate's ``--fbmem`` and
``--sysmem`` (the arithmetic is in ``_planner.py``'s docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._discovery import GpuInfo
from ._memory import HostMemory
from ._plan_types import (
    LEGATE_MIN_MIB,
    SLICE_FACTOR,
    SLICES_IN_FLIGHT,
    SYSMEM_MARGIN,
    MiB,
    Plan,
    fmt_bytes,
)

__all__ = [
    "Split",
    "first_device",
    "kept_besides",
    "plan_cpu",
    "plan_gpus",
    "slice_lines",
    "verdict",
]


@dataclass(frozen=True)
class Split:
    """What both placements (CPU alone, GPUs) start from.

    Arguments:
        keep: the share of free memory a plan may use (1 − headroom).
        per_sample: bytes of one sample of a Jacobian slice.
        partial: bytes a model device keeps for its local ``JᵀJ`` sum (accumulate).
        lines: the plan's explanation so far; each placement adds its own.
        common: the fields of `Plan` that do not depend on the placement.
    """

    keep: float
    per_sample: int
    partial: int
    lines: list[str]
    common: dict[str, Any]

    @property
    def solver(self) -> int:
        """Bytes of the solver's arrays."""
        return int(self.common["solver_bytes"])

    def plan(self, size: int, fits: bool, **placement: Any) -> Plan:
        """The `Plan` of slices of ``size`` samples placed as ``placement`` says."""
        return Plan(
            **self.common, **placement, slice_size=size, slice_bytes=size * self.per_sample,
            fits=fits, lines=tuple(self.lines),
        )  # fmt: skip


def _slice(budget: float, per_sample: int, batch: int, devices: int) -> tuple[int, int]:
    """Largest slice that fits ``budget`` and leaves every device work: (slice, memory cap)."""
    by_memory = int(budget // per_sample) if budget > 0 else 0
    return max(1, min(by_memory, max(1, batch // devices))), by_memory


def slice_lines(
    budget: float,
    per_sample: int,
    batch: int,
    devices: int,
    reserved: str,
    lines: list[str],
    columns: str = "P",
) -> tuple[int, bool]:
    size, by_memory = _slice(budget, per_sample, batch, devices)
    extra = f" after {reserved}" if reserved else ""
    lines.append(
        f"slice memory: {SLICE_FACTOR} x m x {columns} x b = {fmt_bytes(per_sample)} per sample; "
        f"{fmt_bytes(max(budget, 0))} usable per model device{extra} -> at most {by_memory} samples."
    )
    lines.append(
        f"slice_size = min({by_memory}, N // D = {batch} // {devices} = {batch // devices})"
        f" = {size}."
    )
    return size, by_memory >= 1


def kept_besides(solver: int, partial: int) -> str:
    """What a model device keeps besides its slices, in words."""
    parts = [f"{fmt_bytes(solver)} for the solver"] if solver else []
    parts += [f"{fmt_bytes(partial)} for the local JtJ sum"] if partial else []
    return " and ".join(parts)


def plan_cpu(host: HostMemory, split: Split) -> Plan:
    """The plan without a GPU: the model on the CPU, the solver in NumPy, in RAM."""
    keep, per_sample, partial, lines = split.keep, split.per_sample, split.partial, split.lines
    usable = host.available * keep
    solver = split.solver
    lines.append(
        f"no GPU: the model runs on the CPU and the solver in NumPy, in RAM: "
        f"{fmt_bytes(host.available)} available ({host.source}), {fmt_bytes(usable)} usable."
    )
    reserved = kept_besides(solver, partial)
    size, slice_fits = slice_lines(
        usable - solver - partial, per_sample, split.common["batch"], 1, reserved, lines
    )
    fits = slice_fits and solver <= usable
    lines.append(verdict(fits, "RAM", solver + partial + size * per_sample, usable))
    return split.plan(
        size, fits, backend="numpy", legate_gpus=0, model_devices=("cpu",), fbmem_mib=None,
        sysmem_mib=None,
    )  # fmt: skip


def first_device(visible: list[GpuInfo], host: HostMemory, keep: float) -> tuple[float, str]:
    """The usable bytes where a step without Legate runs (the tightest visible GPU, or RAM),
    and where that is in words."""
    if visible:
        return min(gpu.memory_free for gpu in visible) * keep, f"on cuda:{visible[0].ordinal}"
    return host.available * keep, "in RAM"


def verdict(fits: bool, where: str, need: float, have: float) -> str:
    if fits:
        return f"fits: {fmt_bytes(need)} needed of {fmt_bytes(have)} usable {where.removeprefix('in ')}."
    return (
        f"does NOT fit: {fmt_bytes(need)} needed but {fmt_bytes(have)} usable {where}. HINT: use a "
        "smaller batch, float32, more GPUs for Legate, or hide busy GPUs with "
        "CUDA_VISIBLE_DEVICES"
    )


def plan_gpus(visible: list[GpuInfo], forced: int | None, split: Split) -> Plan:
    """The plan on the visible GPUs: Legate's ``K`` (``forced``, or the fewest that hold
    the solver) and the model devices after them."""
    keep, per_sample, partial, lines = split.keep, split.per_sample, split.partial, split.lines
    common = split.common
    solver = split.solver
    usable = [gpu.memory_free * keep for gpu in visible]
    lines.append(
        f"{len(visible)} GPU(s) visible; usable memory (free x {keep:.2f}): "
        + ", ".join(
            f"cuda:{g.ordinal} {fmt_bytes(u)}" for g, u in zip(visible, usable, strict=True)
        )
        + "."
    )
    if len(visible) == 1 and forced is None:
        forced = 0
        lines.append("one GPU: Legate takes none; the solver shares cuda:0 with the model (torch).")
    if forced is None:
        # Legate takes the first K ordinals and spreads its arrays evenly over them: the
        # smallest K whose every GPU holds 1/K of the solver, leaving one GPU to the model.
        k = next(
            (k for k in range(1, len(visible)) if solver / k <= min(usable[:k])),
            len(visible) - 1,
        )
        lines.append(
            f"Legate takes the first K GPUs: K = {k}, the fewest that each hold 1/K of "
            f"{fmt_bytes(solver)} ({fmt_bytes(solver / k)} each) in their usable memory, keeping one "
            "for the model."
        )
    else:
        k = forced
        if len(visible) > 1:
            lines.append(f"Legate takes the first K = {k} GPU(s), as asked.")
    model = visible[k:]
    model_usable = min(usable[k:])
    if k == 0:
        # The solver's arrays sit on the first model device (torch backend).
        budget = model_usable - solver - partial
        solver_fits = solver <= model_usable
        reserved = kept_besides(solver, partial)
    else:
        budget = model_usable - partial
        solver_fits = solver / k <= min(usable[:k])
        reserved = kept_besides(0, partial)
    size, slice_fits = slice_lines(budget, per_sample, common["batch"], len(model), reserved, lines)
    fits = solver_fits and slice_fits
    if k == 0:
        lines.append(verdict(fits, "on cuda:0", solver + partial + size * per_sample, model_usable))
        fbmem = sysmem = None
    else:
        lines.append(
            verdict(solver_fits, f"on each of Legate's {k} GPU(s)", solver / k, min(usable[:k]))
        )
        fbmem = max(LEGATE_MIN_MIB, int(min(usable[:k]) // MiB))
        sysmem, staging = _sysmem(common, size, len(model))
        lines.append(
            f"--fbmem {fbmem}: the usable memory of Legate's smallest GPU, in MiB, so its "
            "temporaries have room."
        )
        lines.append(f"--sysmem {sysmem}: {staging}")
    return split.plan(
        size, fits, backend="torch" if k == 0 else "cupynumeric", legate_gpus=k,
        model_devices=tuple(f"cuda:{g.ordinal}" for g in model), fbmem_mib=fbmem,
        sysmem_mib=sysmem,
    )  # fmt: skip


def _sysmem(common: dict[str, Any], size: int, devices: int) -> tuple[int, str]:
    """Legate's --sysmem in MiB for one step, and the arithmetic in words.

    What crosses host memory (see the module docstring): ``accumulate`` hands over the one
    reduced ``JᵀJ`` and ``Jᵀr`` in float64; ``explicit`` stages ``SLICES_IN_FLIGHT`` slices
    of ``size`` samples per model device, ``J_s`` and ``r_s`` in the Jacobian's dtype. δ
    comes back in float64.
    """
    params, outputs = int(common["params"]), int(common["outputs"])
    item = int(common["jacobian_bytes"]) // (int(common["rows"]) * params)
    if common["strategy"] == "accumulate":
        staged = params * params * 8 + 2 * params * 8
        what = (
            f"host staging per step = the reduced JtJ and Jtr in float64, and delta back "
            f"({params}^2 x 8 + 2 x {params} x 8 = {fmt_bytes(staged)}); "
            "no slice of J and no per-device JtJ part leaves the model devices"
        )
    else:
        in_flight = SLICES_IN_FLIGHT * devices
        slice_rows = size * outputs
        staged = in_flight * slice_rows * (params + 1) * item + params * 8
        what = (
            f"host staging per step = {SLICES_IN_FLIGHT} slices in flight per model device "
            f"({in_flight}), each J_s and r_s of {slice_rows} rows, and delta back "
            f"({in_flight} x {slice_rows} x ({params} + 1) x {item} + {params} x 8 = "
            f"{fmt_bytes(staged)})"
        )
    wanted = staged * (1.0 + SYSMEM_MARGIN)
    sysmem = max(LEGATE_MIN_MIB, math.ceil(wanted / MiB))
    return sysmem, (
        f"{what}; + {SYSMEM_MARGIN:.0%} margin = {fmt_bytes(wanted)}, at least {LEGATE_MIN_MIB} MiB."
    )
