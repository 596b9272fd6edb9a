"""How many GPUs the solver needs, how big a Jacobian slice each model device can take.

One Levenberg-Marquardt step (Marquardt 1963; Gavin's LM notes, §4) solves
``(JᵀJ + λD) δ = Jᵀr`` with ``J`` the ``R × P`` Jacobian of the ``R = N·m`` residuals
(``N`` samples, ``m`` residuals each) with respect to the ``P`` parameters. The solver
holds either

* ``J`` itself (strategy ``explicit``): ``R·P·b`` bytes at ``b`` bytes per element, plus
  the float64 matrix it factorises, ``P × P`` (or ``R × R`` when ``R < P``, the
  under-determined form ``δ = Jᵀ(JJᵀ + λI)⁻¹r``); or
* only ``JᵀJ`` and ``Jᵀr`` summed slice by slice on the model devices (``accumulate``):
  ``P·P·8`` bytes, whatever ``N``.

``accumulate`` is chosen when ``R ≥ P`` (then ``JᵀJ`` is no larger than ``J``),
``explicit`` otherwise. Factorisation always runs in float64, and a copy of the matrix is
kept so a rejected step can be re-damped: the solver needs ``2·8·S²`` bytes for an
``S × S`` system. Legate spreads its arrays evenly over its GPUs, so it gets the fewest K
whose every GPU holds 1/K of the solver's bytes in its usable memory (free memory less
the headroom); a model device takes slices of ``s`` samples whose
Jacobian ``s·m·P·b`` bytes, times 3 for the slice, its copy on the way to the solver and
autograd's work, fits its usable memory, and at most ``N // D`` samples over ``D`` model
devices so that every device has work (data parallelism).

Legate's ``--sysmem`` is sized from what crosses host memory on the way to the solver in one
step, plus ``SYSMEM_MARGIN``. With ``accumulate`` the model devices sum their partial
``JᵀJ`` and ``Jᵀr``, the sums are added on the first model device, and only that one float64
``P × P`` matrix and ``P`` vector are copied to the host and attached to Legate (no slice of
``J`` and no per-device partial leaves the GPUs). With ``explicit`` every slice ``J_s`` (and
its residuals) goes through a fresh pinned host buffer that Legate attaches and copies into
its ``J``; the Jacobian engine keeps at most 2 slices per model device in flight. Either way
δ (``P`` float64) comes back through the host once per attempt.

When neither fits (and the strategy was not forced), the plan is a step on parameter
subsets (``LMA(params_per_step=k)``, ``_plan_subsets``): each step forms only ``k``
columns of ``J`` and solves a ``k × k`` system, on the first model device (or in RAM).
Besides ``θ``, its backup and the scattered δ (``P·(2b + 8)`` bytes), half of the usable
memory goes to the system, ``3·8·k²`` bytes (the accumulated ``J_SᵀJ_S`` in float64, the
matrix the backend factorises and its damped copy), and the rest to slices of
``SLICE_FACTOR·m·k·b`` bytes per sample; ``k`` is the largest multiple of 64 that fits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._discovery import GpuInfo, survey
from ._memory import HostMemory, host_memory

Strategy = Literal["explicit", "accumulate", "subsets"]
Backend = Literal["cupynumeric", "torch", "numpy"]

MiB = 1 << 20
#: Bytes per element of the dtypes a Jacobian may be computed in.
ITEMSIZE: dict[str, int] = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
}
#: Model-side memory per slice, in multiples of the slice's Jacobian (see the module doc).
SLICE_FACTOR = 3
#: The least --fbmem / --sysmem worth passing to Legate, in MiB.
LEGATE_MIN_MIB = 256
#: Fraction added to the host bytes staged per step when sizing --sysmem (allocator slack,
#: Legate's own small host-side arrays).
SYSMEM_MARGIN = 0.25
#: Slices the Jacobian engine keeps in flight per model device (its ``map_ordered`` window).
SLICES_IN_FLIGHT = 2


def _fmt(nbytes: float) -> str:
    """Bytes in binary units: ``9.04 MiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} B"


@dataclass(frozen=True)
class Plan:
    """A recommendation: Legate's GPU count, the model devices, the slice size and strategy.

    All sizes are bytes. ``fits`` is false when even the best split leaves too little
    memory; ``explain()`` then says what does not fit and what to change.
    """

    params: int
    batch: int
    outputs: int
    dtype: str
    rows: int
    strategy: Strategy
    backend: Backend
    legate_gpus: int
    model_devices: tuple[str, ...]
    slice_size: int
    jacobian_bytes: int
    normal_bytes: int
    solver_bytes: int
    slice_bytes: int
    fits: bool
    fbmem_mib: int | None
    sysmem_mib: int | None
    lines: tuple[str, ...] = field(default=(), repr=False)
    params_per_step: int | None = None

    def command(self, script: str = "script.py") -> str:
        """The command line that runs ``script`` with this split."""
        if self.params_per_step is not None:
            return (
                f"python {script} --slice-size {self.slice_size} "
                f"--params-per-step {self.params_per_step}"
            )
        if self.legate_gpus == 0:
            return f"python {script} --slice-size {self.slice_size}"
        return (
            f"legate --gpus {self.legate_gpus} --fbmem {self.fbmem_mib} "
            f"--sysmem {self.sysmem_mib} {script} --slice-size {self.slice_size}"
        )

    def explain(self) -> str:
        """The arithmetic behind the recommendation, one plain line per step."""
        return "\n".join(self.lines)


def _itemsize(dtype: Any) -> tuple[str, int]:
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        if name in ITEMSIZE:
            return name, ITEMSIZE[name]
    else:
        size = getattr(dtype, "itemsize", None)
        if isinstance(size, int) and size > 0:
            return str(dtype).removeprefix("torch."), size
    raise ValueError(
        f"dtype={dtype!r} was given; the planner knows {', '.join(sorted(ITEMSIZE))} "
        "(or a torch.dtype). HINT: pass dtype='float32' or 'float64'"
    )


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name}={value!r} was given; it must be a whole number >= 1. "
            f"HINT: pass the model's {name} as an int"
        )
    return value


def _solver_bytes(strategy: Strategy, rows: int, params: int, item: int) -> tuple[int, str]:
    """Bytes the solver holds, and the formula in words."""
    if strategy == "accumulate":
        return 2 * params * params * 8 + 3 * params * 8, (
            f"2 x {params}^2 x 8 (JtJ and its damped copy, float64) + 3 x {params} x 8 (vectors)"
        )
    side = min(rows, params)
    return rows * params * item + 2 * side * side * 8 + (rows + params) * 8, (
        f"{rows} x {params} x {item} (J) + 2 x {side}^2 x 8 (normal matrix and copy, float64)"
        f" + ({rows} + {params}) x 8 (vectors)"
    )


def plan(
    params: int,
    batch: int,
    outputs: int = 1,
    dtype: Any = "float32",
    gpus: Sequence[GpuInfo] | None = None,
    *,
    legate_gpus: int | None = None,
    strategy: Literal["auto", "explicit", "accumulate"] = "auto",
    headroom: float = 0.2,
    host: HostMemory | None = None,
) -> Plan:
    """Plan one LM step of ``params`` parameters over ``batch`` samples of ``outputs`` residuals.

    ``gpus`` defaults to the visible GPUs (NVML); pass ``[]`` to plan for the CPU. ``headroom``
    is the fraction of each device's free memory left untouched. ``legate_gpus`` forces K.
    Every argument is checked before any arithmetic.
    """
    params, batch, outputs = (
        _positive("params", params),
        _positive("batch", batch),
        _positive("outputs", outputs),
    )
    name, item = _itemsize(dtype)
    if not 0.0 <= headroom < 1.0:
        raise ValueError(
            f"headroom={headroom!r} was given; it is the fraction of free memory kept "
            "unused, in [0, 1). HINT: 0.2 keeps a fifth free"
        )
    if strategy not in ("auto", "explicit", "accumulate"):
        raise ValueError(
            f"strategy={strategy!r} was given; expected 'auto', 'explicit' or 'accumulate'. "
            "HINT: leave it 'auto' to choose by the shape of J"
        )
    visible = list(survey().gpus if gpus is None else gpus)
    if legate_gpus is not None and not 0 <= legate_gpus < max(len(visible), 1):
        raise ValueError(
            f"legate_gpus={legate_gpus!r} was given but {len(visible)} GPU(s) are visible and "
            "the model needs at least one. HINT: pass legate_gpus between 0 and "
            f"{max(len(visible) - 1, 0)}, or leave it None to let the planner choose"
        )
    rows = batch * outputs
    chosen: Strategy = (
        ("accumulate" if rows >= params else "explicit") if strategy == "auto" else strategy
    )
    jacobian = rows * params * item
    normal = params * params * 8
    solver, formula = _solver_bytes(chosen, rows, params, item)
    keep = 1.0 - headroom
    lines = [
        f"J has R = N x m = {batch} x {outputs} = {rows} rows and P = {params} columns "
        f"of {name} ({item} B).",
        f"J whole: R x P x {item} = {_fmt(jacobian)}; JtJ: P x P x 8 = {_fmt(normal)}.",
        f"strategy {chosen}: "
        + (
            "R >= P, so JtJ and Jtr are summed slice by slice and J is never whole."
            if chosen == "accumulate" and strategy == "auto"
            else "R < P, so the solver holds J and solves the R x R system."
            if strategy == "auto"
            else "forced."
        ),
        f"solver memory: {formula} = {_fmt(solver)}.",
    ]
    common = dict(
        params=params, batch=batch, outputs=outputs, dtype=name, rows=rows, strategy=chosen,
        jacobian_bytes=jacobian, normal_bytes=normal, solver_bytes=solver,
    )  # fmt: skip
    per_sample = SLICE_FACTOR * outputs * params * item
    partial = normal if chosen == "accumulate" else 0
    host = host or host_memory()
    if not visible:
        full = _plan_cpu(host, keep, per_sample, partial, lines, common)
    else:
        full = _plan_gpus(visible, legate_gpus, keep, per_sample, partial, lines, common)
    if full.fits or strategy != "auto" or legate_gpus is not None:
        return full
    return _plan_subsets(full, visible, host, keep, item)


#: Subset sizes are rounded down to a multiple of this many parameters.
SUBSET_ROUNDING = 64


def subset_size(usable: float, params: int, item: int) -> int:
    """The largest ``k`` (a multiple of ``SUBSET_ROUNDING`` when possible, at most ``P``)
    whose ``3·8·k²`` system bytes take at most half of ``usable`` after ``P·(2b + 8)``
    (θ, its backup, the scattered δ); 0 when not even one parameter fits."""
    room = (usable - params * (2 * item + 8)) / 2
    if room < 24:
        return 0
    k = min(params, math.isqrt(int(room // 24)))
    return k - k % SUBSET_ROUNDING if k >= 2 * SUBSET_ROUNDING else k


def _plan_subsets(
    full: Plan, visible: list[GpuInfo], host: HostMemory, keep: float, item: int
) -> Plan:
    """Parameter subsets per step, solved on the first model device (torch) or in RAM."""
    params, batch, outputs = full.params, full.batch, full.outputs
    lines = list(full.lines)
    if visible:
        usable = min(gpu.memory_free for gpu in visible) * keep
        where = f"on cuda:{visible[0].ordinal}"
    else:
        usable = host.available * keep
        where = "in RAM"
    k = subset_size(usable, params, item)
    fixed = params * (2 * item + 8)
    system = 24 * k * k
    lines.append(
        f"neither strategy fits: parameter subsets per step (LMA(params_per_step=k)). "
        f"theta, its backup and delta: P x ({2 * item} + 8) = {_fmt(fixed)}; the k x k system: "
        f"3 x k^2 x 8 (JtJ_S, the float64 matrix and its damped copy), at most half of the "
        f"{_fmt(usable - fixed)} left {where} -> k = {k}"
        + (f" (a multiple of {SUBSET_ROUNDING})" if k >= 2 * SUBSET_ROUNDING else "")
        + f", {_fmt(system)}."
    )
    devices = max(1, len(visible))
    per_sample = SLICE_FACTOR * outputs * max(k, 1) * item
    size, slice_fits = _slice_lines(
        usable - fixed - system, per_sample, batch, devices, _reserved(system, 0), lines, "k"
    )
    fits = k >= 1 and slice_fits
    lines.append(_verdict(fits, where, fixed + system + size * per_sample, usable))
    return Plan(
        params=params, batch=batch, outputs=outputs, dtype=full.dtype, rows=full.rows,
        strategy="subsets", jacobian_bytes=full.jacobian_bytes, normal_bytes=full.normal_bytes,
        solver_bytes=system, backend="torch" if visible else "numpy", legate_gpus=0,
        model_devices=tuple(f"cuda:{g.ordinal}" for g in visible) or ("cpu",),
        slice_size=size, slice_bytes=size * per_sample, fits=fits, fbmem_mib=None,
        sysmem_mib=None, lines=tuple(lines), params_per_step=k,
    )  # fmt: skip


def _slice(budget: float, per_sample: int, batch: int, devices: int) -> tuple[int, int]:
    """Largest slice that fits ``budget`` and leaves every device work: (slice, memory cap)."""
    by_memory = int(budget // per_sample) if budget > 0 else 0
    return max(1, min(by_memory, max(1, batch // devices))), by_memory


def _slice_lines(
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
        f"slice memory: {SLICE_FACTOR} x m x {columns} x b = {_fmt(per_sample)} per sample; "
        f"{_fmt(max(budget, 0))} usable per model device{extra} -> at most {by_memory} samples."
    )
    lines.append(
        f"slice_size = min({by_memory}, N // D = {batch} // {devices} = {batch // devices})"
        f" = {size}."
    )
    return size, by_memory >= 1


def _reserved(solver: int, partial: int) -> str:
    """What a model device keeps besides its slices, in words."""
    parts = [f"{_fmt(solver)} for the solver"] if solver else []
    parts += [f"{_fmt(partial)} for the local JtJ sum"] if partial else []
    return " and ".join(parts)


def _plan_cpu(
    host: HostMemory,
    keep: float,
    per_sample: int,
    partial: int,
    lines: list[str],
    common: dict[str, Any],
) -> Plan:
    usable = host.available * keep
    solver = int(common["solver_bytes"])
    lines.append(
        f"no GPU: the model runs on the CPU and the solver in NumPy, in RAM: "
        f"{_fmt(host.available)} available ({host.source}), {_fmt(usable)} usable."
    )
    reserved = _reserved(solver, partial)
    size, slice_fits = _slice_lines(
        usable - solver - partial, per_sample, common["batch"], 1, reserved, lines
    )
    fits = slice_fits and solver <= usable
    lines.append(_verdict(fits, "RAM", solver + partial + size * per_sample, usable))
    return Plan(
        **common, backend="numpy", legate_gpus=0, model_devices=("cpu",), slice_size=size,
        slice_bytes=size * per_sample, fits=fits, fbmem_mib=None, sysmem_mib=None,
        lines=tuple(lines),
    )  # fmt: skip


def _verdict(fits: bool, where: str, need: float, have: float) -> str:
    if fits:
        return f"fits: {_fmt(need)} needed of {_fmt(have)} usable {where.removeprefix('in ')}."
    return (
        f"does NOT fit: {_fmt(need)} needed but {_fmt(have)} usable {where}. HINT: use a "
        "smaller batch, float32, more GPUs for Legate, or hide busy GPUs with "
        "CUDA_VISIBLE_DEVICES"
    )


def _plan_gpus(
    visible: list[GpuInfo],
    forced: int | None,
    keep: float,
    per_sample: int,
    partial: int,
    lines: list[str],
    common: dict[str, Any],
) -> Plan:
    solver = int(common["solver_bytes"])
    usable = [gpu.memory_free * keep for gpu in visible]
    lines.append(
        f"{len(visible)} GPU(s) visible; usable memory (free x {keep:.2f}): "
        + ", ".join(f"cuda:{g.ordinal} {_fmt(u)}" for g, u in zip(visible, usable, strict=True))
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
            f"{_fmt(solver)} ({_fmt(solver / k)} each) in their usable memory, keeping one "
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
        reserved = _reserved(solver, partial)
    else:
        budget = model_usable - partial
        solver_fits = solver / k <= min(usable[:k])
        reserved = _reserved(0, partial)
    size, slice_fits = _slice_lines(
        budget, per_sample, common["batch"], len(model), reserved, lines
    )
    fits = solver_fits and slice_fits
    if k == 0:
        lines.append(
            _verdict(fits, "on cuda:0", solver + partial + size * per_sample, model_usable)
        )
        fbmem = sysmem = None
    else:
        lines.append(
            _verdict(solver_fits, f"on each of Legate's {k} GPU(s)", solver / k, min(usable[:k]))
        )
        fbmem = max(LEGATE_MIN_MIB, int(min(usable[:k]) // MiB))
        sysmem, staging = _sysmem(common, size, len(model))
        lines.append(
            f"--fbmem {fbmem}: the usable memory of Legate's smallest GPU, in MiB, so its "
            "temporaries have room."
        )
        lines.append(f"--sysmem {sysmem}: {staging}")
    return Plan(
        **common, backend="torch" if k == 0 else "cupynumeric", legate_gpus=k,
        model_devices=tuple(f"cuda:{g.ordinal}" for g in model), slice_size=size,
        slice_bytes=size * per_sample, fits=fits, fbmem_mib=fbmem, sysmem_mib=sysmem,
        lines=tuple(lines),
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
            f"({params}^2 x 8 + 2 x {params} x 8 = {_fmt(staged)}); "
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
            f"{_fmt(staged)})"
        )
    wanted = staged * (1.0 + SYSMEM_MARGIN)
    sysmem = max(LEGATE_MIN_MIB, math.ceil(wanted / MiB))
    return sysmem, (
        f"{what}; + {SYSMEM_MARGIN:.0%} margin = {_fmt(wanted)}, at least {LEGATE_MIN_MIB} MiB."
    )
