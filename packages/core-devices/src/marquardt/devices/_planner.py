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

Time (``_step_time.py``): each strategy's step is predicted in seconds from the machine's
rates (``machine``; where none are given, `DEFAULT_CONSTANTS` give an indication in the
lines and the choice is by memory alone). With ``strategy="auto"`` the plan is matrix-free (``_plan_matrix_free.py``: CG on products JᵀJv, memory linear in
``P``) where the dense step is predicted ``DENSE_STEP_WORTH`` times slower (a dense step
solves exactly, a matrix-free one truncates), or where the dense step
does not fit and the matrix-free one does: past the dense wall, matrix-free steps move
every parameter in seconds, where a subset step moves ``k`` of them.

When neither dense strategy nor the matrix-free step fits (and the strategy was not
forced), the plan is a step on parameter subsets (``LMA(params_per_step=k)``, ``_plan_subsets.py``): each step forms only ``k``
columns of ``J`` and solves a ``k × k`` system, on the first model device (or in RAM).
Besides ``θ``, its backup and the scattered δ (``P·(2b + 8)`` bytes), half of the usable
memory goes to the system, ``3·8·k²`` bytes (the accumulated ``J_SᵀJ_S`` in float64, the
matrix the backend factorises and its damped copy), and the rest to slices of
``SLICE_FACTOR·m·k·b`` bytes per sample; ``k`` is the largest multiple of 64 that fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from ._discovery import GpuInfo, survey
from ._machine import DEFAULT_CONSTANTS, MachineConstants
from ._memory import HostMemory, host_memory
from ._plan_matrix_free import plan_matrix_free, predicted
from ._plan_split import Split, plan_cpu, plan_gpus
from ._plan_subsets import plan_subsets
from ._plan_types import ITEMSIZE, SLICE_FACTOR, Plan, Strategy, fmt_bytes
from ._step_time import prefers_matrix_free
from ._whole import is_whole

__all__ = ["plan"]


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
    if not is_whole(value, 1):
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
    machine: MachineConstants | None = None,
) -> Plan:
    """Plan one LM step of ``params`` parameters over ``batch`` samples of ``outputs`` residuals.

    The arithmetic (the strategy, Legate's ``K``, the slice size, ``--fbmem`` and
    ``--sysmem``, the subsets fallback) is the module's docstring. Every argument is
    checked before any arithmetic.

    Arguments:
        params: ``P``, the model's parameter count (≥ 1).
        batch: ``N``, the samples in one step (≥ 1).
        outputs: ``m``, the residuals per sample (≥ 1).
        dtype: the Jacobian's dtype: a name (``"float32"``, ``"float64"``…) or a
            ``torch.dtype``.
        gpus: the GPUs to plan for; ``None``: the visible GPUs (NVML); ``[]``: the CPU.
        legate_gpus: forces ``K``, the GPUs Legate takes (``None``: the fewest that hold
            the solver).
        strategy: ``"auto"`` (by the shape of ``J``), or ``"explicit"`` / ``"accumulate"``
            forced; a forced strategy never falls back to parameter subsets.
        headroom: the fraction of each device's free memory left untouched, in [0, 1).
        host: the host's memory (``None``: read from the system).
        machine: the machine's rates for the step-time prediction; with them a slow dense
            step gives way to a matrix-free one (``None``: `DEFAULT_CONSTANTS`, a modest
            CPU, for the lines only; the choice is by memory alone).

    Returns:
        The `Plan`; where neither strategy fits and nothing was forced, a plan on
        parameter subsets.

    Raises:
        ValueError: a count that is not a whole number ≥ 1, an unknown dtype or
            strategy, ``headroom`` outside [0, 1), or ``legate_gpus`` that leaves the
            model no GPU.
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
        f"J whole: R x P x {item} = {fmt_bytes(jacobian)}; JtJ: P x P x 8 = {fmt_bytes(normal)}.",
        f"strategy {chosen}: "
        + (
            "R >= P, so JtJ and Jtr are summed slice by slice and J is never whole."
            if chosen == "accumulate" and strategy == "auto"
            else "R < P, so the solver holds J and solves the R x R system."
            if strategy == "auto"
            else "forced."
        ),
        f"solver memory: {formula} = {fmt_bytes(solver)}.",
    ]
    common = dict(
        params=params, batch=batch, outputs=outputs, dtype=name, rows=rows, strategy=chosen,
        jacobian_bytes=jacobian, normal_bytes=normal, solver_bytes=solver,
    )  # fmt: skip
    per_sample = SLICE_FACTOR * outputs * params * item
    partial = normal if chosen == "accumulate" else 0
    host = host or host_memory()
    split = Split(keep, per_sample, partial, lines, common)
    rates = machine or DEFAULT_CONSTANTS
    times = predicted(chosen, rows, params, item, rates)
    lines.append(f"time ({rates.source} machine rates): {times[0].words()}; {times[1].words()}.")
    full = plan_gpus(visible, legate_gpus, split) if visible else plan_cpu(host, split)
    full = replace(full, step_seconds=times[0].seconds)
    if strategy != "auto" or legate_gpus is not None:
        return full
    if not full.fits or (machine is not None and prefers_matrix_free(*times)):
        free = plan_matrix_free(full, visible, host, keep, item, times)
        if free.fits:
            return free
    if full.fits:
        return full
    return plan_subsets(full, visible, host, keep, item)
