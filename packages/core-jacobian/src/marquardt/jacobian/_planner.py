"""Choosing the product strategy and the Jacobian mode, within a memory budget.

Strategy. With ``R = N·m`` residual rows and ``P`` parameters, the LM step solves
``(JᵀJ + λD)δ = Jᵀr`` when ``R ≥ P`` (Marquardt 1963), which needs only the ``P×P`` and
``P`` sums ``Σ_s J_sᵀJ_s`` and ``Σ_s J_sᵀr_s`` (``accumulate``: memory ``O(P²)``,
independent of ``N``); when ``R < P`` the ``R×R`` system ``(JJᵀ + λI)u = r``,
``δ = Jᵀu`` needs ``J`` itself (``explicit``).

Mode. The modes, what they serve and cost, and the order in which ``auto`` prefers them
are the entries of ``_modes._table`` (`MODE_TABLE`): the planner takes the first mode
that serves the residual form, applies to the model (its check, where it has one) and
suits the sizes (``jacfwd`` only when ``P < m``: forward mode wins when there are fewer
inputs than outputs); a mode that is asked for but does not apply gives way to its
fallback, with the reason. Residuals that differentiate the model by its inputs
(``PointResidual``) keep, per sample, the graph of those derivatives: ``input_graph``
times the activations (for a Hessian by forward-over-reverse in ``d`` dimensions,
``2(d + 1)``), counted in every mode's memory. Chunks hold as many samples as the
budget allows by the mode's memory per sample; ``jacfwd`` is chunked over columns as well,
because forward mode over a whole large slice is what exhausts time and memory.

Slices. An explicit ``slice_size`` is kept. Without one (``slice_size=None``) the engine
gives each device ``⌈N/D⌉`` samples; for ``accumulate`` the planner then caps a slice at
one chunk (``slice_samples = samples_per_chunk``), so a device never holds more than one
budget's worth of ``J_s`` and workspace whatever ``N`` is: peak memory is flat in ``N``.
``explicit`` keeps the whole-slice semantics (the backend holds ``J`` anyway).

``matrix_free`` never forms ``J``: each conjugate-gradient iteration of the step takes one
Jacobian-vector and one vector-Jacobian product per chunk (``_gauss_newton``). A chunk
holds ``≈ b·(PRODUCT_ACTIVATIONS·a + m)`` numbers besides a few ``P``-vectors, so memory
is ``O(P + b·a)``; slices are capped at one chunk as for ``accumulate``.

Time. Given the machine's rates (``machine``, a ``marquardt.devices.MachineConstants``),
``auto`` predicts one step's seconds of the dense strategy of the shape and of
``matrix_free`` (``marquardt.devices.step_seconds``: products, factorisations, memory
traffic) and takes the matrix-free one where it wins (``prefers_matrix_free``: the dense
step is predicted several times slower, since it solves exactly), saying both figures: a dense step of
minutes is not chosen where a matrix-free one takes seconds. Without rates, ``auto``
keeps the dense strategy. Whether ``P × P`` or ``R × R`` fits is the solver's question
(it knows the memory of the device it solves on, and goes matrix-free when neither does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from marquardt.devices import MachineConstants, prefers_matrix_free, step_seconds

from ._errors import UnknownModeError, message
from ._modes._table import AUTO, FORMS, MODE_TABLE, OUTPUTS, JacobianMode, Sizes, check_mode

__all__ = ["STRATEGIES", "JacobianPlan", "plan_jacobian"]

STRATEGIES = ("auto", "explicit", "accumulate", "matrix_free")
#: Per sample, a Gauss-Newton product keeps the forward's activations for the reverse pass
#: and the forward-mode tangents alongside them: about this many times the activations.
PRODUCT_ACTIVATIONS = 4


@dataclass(frozen=True)
class JacobianPlan:
    """What the planner chose and why.

    Arguments:
        strategy: ``accumulate``, ``explicit`` or ``matrix_free``.
        mode: the Jacobian mode (``layers``, ``vmap``, ``broadcast``, ``jacfwd``), or
            ``products`` for ``matrix_free``.
        reason: the choices and their reasons, in words, ``"; "``-separated.
        rows: ``R = N·m``, the residual rows.
        params: ``P``, the columns of ``J``.
        outputs_per_sample: ``m``, the residual rows per sample.
        samples_per_chunk: how many samples are differentiated at once (a slice is cut
            into such chunks).
        param_chunk: the number of columns per forward-mode call (``jacfwd`` only, else
            ``P``).
        chunk_bytes: the estimated intermediate memory per chunk.
        memory_budget: the budget the chunks were sized for, in bytes.
        slice_samples: the largest slice a device gets (``accumulate`` without a
            ``slice_size``: one chunk).
        product_flops: the estimated flops of one step's products (the Gram product, or
            for ``matrix_free`` one Gauss-Newton product).
        factor_flops: the estimated flops of one Cholesky factorisation of the damped
            system (0 for ``matrix_free``).
    """

    strategy: str
    mode: str
    reason: str
    rows: int
    params: int
    outputs_per_sample: int
    samples_per_chunk: int
    param_chunk: int
    chunk_bytes: int
    memory_budget: int
    slice_samples: int = 0
    product_flops: int = 0
    factor_flops: int = 0

    @property
    def system_size(self) -> int:
        """The order of the damped system: ``P`` (accumulate, matrix_free) or ``R``
        (explicit, R < P)."""
        return self.params if self.strategy != "explicit" or self.rows >= self.params else self.rows


def _check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise UnknownModeError(
            message(
                f"the Jacobian strategy {strategy!r} was requested",
                f"the known ones are {', '.join(STRATEGIES)}",
                f"pass one of {', '.join(STRATEGIES)}",
            )
        )
    return strategy


def plan_jacobian(
    rows: int,
    params: int,
    outputs_per_sample: int,
    dtype: torch.dtype,
    memory_budget: int,
    *,
    strategy: str = "auto",
    mode: str = "auto",
    layers_supported: bool = True,
    layers_reason: str = "",
    broadcast_supported: bool = False,
    broadcast_reason: str = "",
    activations_per_sample: int | None = None,
    slice_samples: int | None = None,
    cap_slices: bool = False,
    input_graph: int = 1,
    form: str = OUTPUTS,
    support: Mapping[str, tuple[bool, str]] | None = None,
    machine: MachineConstants | None = None,
) -> JacobianPlan:
    """Choose ``strategy`` and ``mode`` for ``rows`` residual rows and ``params`` parameters.

    Chunks never exceed ``slice_samples``, and never exceed ``memory_budget`` bytes by the
    modes' memory per sample (at least one sample and one column always run).

    Arguments:
        rows: ``R = N·m``, the residual rows.
        params: ``P``, the parameters (columns of ``J``).
        outputs_per_sample: ``m``, the residual rows per sample.
        dtype: the dtype of ``J``.
        memory_budget: the bytes a chunk's intermediates may take.
        strategy: ``auto`` (``explicit`` when ``R < P``, else ``accumulate``),
            ``explicit``, ``accumulate`` or ``matrix_free`` (never chosen by ``auto``).
        mode: ``auto`` or a mode of the table (``vmap``, ``jacfwd``, ``layers``,
            ``broadcast``).
        layers_supported: whether every layer has a per-sample rule (``layers``).
        layers_reason: why (or why not), for the plan's reason.
        broadcast_supported: whether the model declares per-sample parameters
            (``broadcast``, chosen first where supported).
        broadcast_reason: why (or why not), for the plan's reason.
        activations_per_sample: ``a``, the activations of one sample; default ``P``.
        slice_samples: the largest slice a device will get; default: all samples.
        cap_slices: the caller has no ``slice_size``: an ``accumulate`` (or
            ``matrix_free``) slice is capped at one chunk, so its memory is bounded by the
            budget and independent of ``rows``.
        input_graph: for residuals that differentiate the model by its inputs, the size
            of the input-derivative graph, which multiplies the activations per sample.
        form: the residual form (``outputs`` or ``points``): only the modes that serve
            it may be chosen.
        support: for modes with a model check, by name, whether the model passed it and
            why (or why not); it completes the ``layers_*`` and ``broadcast_*`` keywords.
        machine: the machine's rates: ``auto`` then takes ``matrix_free`` where its step is
            predicted faster than the dense one (None: the dense strategy).

    Returns:
        The plan, with its reasons in words.

    Raises:
        UnknownModeError: ``strategy`` or ``mode`` is not one of the known ones.
    """
    _check_strategy(strategy)
    check_mode(mode)
    m = max(1, outputs_per_sample)
    samples = max(1, rows // m)
    problem = _Problem(
        rows=rows,
        params=params,
        m=m,
        item=torch.empty((), dtype=dtype).element_size(),
        slice_n=max(1, min(slice_samples or samples, samples)),
        budget=max(1, memory_budget),
    )
    act = activations_per_sample if activations_per_sample is not None else params
    act = max(1, act) * max(1, input_graph)
    reasons: list[str] = []
    strategy = _strategy(strategy, problem, machine, reasons)
    if strategy == "matrix_free":
        return _matrix_free(problem, act, cap_slices, reasons)
    checks = {
        "layers": (layers_supported, layers_reason),
        "broadcast": (broadcast_supported, broadcast_reason),
        **(support or {}),
    }
    sizes = Sizes(params=params, outputs=m, activations=act, item=problem.item)
    chosen, why = choose_mode(mode, form, sizes, checks)
    reasons.append(why)
    if input_graph > 1:
        reasons.append(f"input-derivative graph: {input_graph}× the activations per sample")
    chunking = chunk_sizes(chosen, sizes, problem.slice_n, problem.budget)
    chunk, param_chunk, chunk_bytes = chunking
    reasons.append(
        f"chunks of {chunk} samples"
        + (f" × {param_chunk} columns" if chosen.column_memory is not None else "")
        + f" (≈{chunk_bytes / 2**20:.1f} MiB of {problem.budget / 2**20:.1f} MiB budget)"
    )
    n = params if strategy == "accumulate" or rows >= params else rows
    product_flops = rows * params * n
    factor_flops = n**3 // 3
    return _plan(
        strategy,
        chosen.name,
        reasons,
        problem,
        chunking=chunking,
        cap_slices=cap_slices and strategy == "accumulate",
        flops=(product_flops, factor_flops),
        system=(
            f"{n}×{n} system: Gram product ≈{product_flops / 1e9:.3g} GFLOP per step, "
            f"Cholesky ≈{factor_flops / 1e9:.3g} GFLOP per attempt"
        ),
    )


@dataclass(frozen=True)
class _Problem:
    """The sizes a plan is made for: R rows, P parameters, m rows per sample, the bytes of
    one entry, the largest slice and the memory budget."""

    rows: int
    params: int
    m: int
    item: int
    slice_n: int
    budget: int


def _strategy(
    strategy: str, problem: _Problem, machine: MachineConstants | None, reasons: list[str]
) -> str:
    """The strategy asked for, or ``auto``'s choice; the reason said in ``reasons``."""
    rows, params = problem.rows, problem.params
    if strategy != "auto":
        reasons.append(f"{strategy}: forced")
        return strategy
    if rows < params:
        strategy = "explicit"
        reasons.append(f"explicit: {rows} rows < {params} parameters (J is needed whole)")
    else:
        strategy = "accumulate"
        reasons.append(f"accumulate: {rows} rows >= {params} parameters (JᵀJ is O(P²))")
    if machine is not None:
        strategy = _fastest(strategy, rows, params, problem.item, machine, reasons)
    return strategy


def _matrix_free(problem: _Problem, act: int, cap_slices: bool, reasons: list[str]) -> JacobianPlan:
    """The ``matrix_free`` plan: ``act`` activations per sample."""
    # One jvp and one vjp per chunk and CG iteration: the forward's activations, the
    # tangents alongside them, and the residual rows; J is never formed.
    per_sample = problem.item * (PRODUCT_ACTIVATIONS * act + 2 * problem.m)
    chunk = max(1, min(problem.slice_n, problem.budget // per_sample))
    reasons.append(
        f"products: one jvp and one vjp per chunk of {chunk} samples per CG iteration "
        f"(≈{chunk * per_sample / 2**20:.1f} MiB of {problem.budget / 2**20:.1f} MiB budget), "
        "J never formed"
    )
    return _plan(
        "matrix_free",
        "products",
        reasons,
        problem,
        chunking=(chunk, problem.params, chunk * per_sample),
        cap_slices=cap_slices,
        # One Gauss-Newton product: ≈ 3 forwards and 2 backwards' worth of 2·R·P flops.
        flops=(2 * problem.rows * problem.params * 5, 0),
    )


def _fastest(
    dense: str, rows: int, params: int, item: int, machine: MachineConstants, reasons: list[str]
) -> str:
    """``dense``, or ``matrix_free`` where it wins (``prefers_matrix_free``), the figures
    said."""
    times = [step_seconds(s, rows, params, item, machine) for s in (dense, "matrix_free")]
    best = "matrix_free" if prefers_matrix_free(*times) else dense
    reasons.append(
        f"{best}: by the predicted steps ({'; '.join(t.words() for t in times)}; "
        f"{machine.source} machine rates)"
    )
    return best


def choose_mode(
    mode: str, form: str, sizes: Sizes, checks: Mapping[str, tuple[bool, str]]
) -> tuple[JacobianMode, str]:
    """The mode of the table that forms ``J``, and the reason, in words.

    A mode applies when it serves ``form`` and, where it has a model check, the model
    passed it (``checks``; a mode the caller says nothing of applies when it is
    ``assumed``). ``auto`` takes the first mode of the table that applies and suits the
    sizes; a mode asked for that does not apply gives way to its fallback.

    Arguments:
        mode: ``auto`` or a mode of the table.
        form: the residual form.
        sizes: the problem's sizes.
        checks: by mode name, whether the model passed its check, and why (or why not).

    Returns:
        The mode and the reason for it.
    """

    def applies(entry: JacobianMode) -> tuple[bool, str]:
        if not entry.serves(form):
            return False, FORMS[form]
        if entry.support is None:
            return True, ""
        return checks.get(entry.name, (entry.assumed, ""))

    if mode != AUTO:
        entry = MODE_TABLE[mode]
        ok, why = applies(entry)
        if ok:
            return entry, f"{entry.name}: forced" + (f" ({why})" if why else "")
        asked, why_not = entry, why
        while not ok and entry.fallback is not None:
            entry = MODE_TABLE[entry.fallback]
            ok, _ = applies(entry)
        if ok:
            return entry, f"{entry.name}: {asked.name} was requested but {why_not}"
    passed = ""
    for entry in MODE_TABLE.values():
        ok, why = applies(entry)
        if not ok:
            if entry.serves(form) or not passed:
                # The reason of the last mode passed by that serves the form says most.
                passed = why or passed
        elif entry.chosen_when(sizes):
            own = why or entry.why(sizes)
            return entry, f"{entry.name}: " + "; ".join(t for t in (own, passed) if t)
    raise UnknownModeError(  # pragma: no cover - the table's last mode serves every form
        message(
            f"a Jacobian mode for residuals of form {form!r} was requested",
            f"no mode of the table ({', '.join(MODE_TABLE)}) serves it",
            "register a mode that serves this form",
        )
    )


def chunk_sizes(
    mode: JacobianMode, sizes: Sizes, slice_n: int, budget: int
) -> tuple[int, int, int]:
    """``(samples per chunk, columns per call, bytes per chunk)`` of ``mode`` within
    ``budget``, never more samples than ``slice_n`` (nor than the mode's ``max_chunk``)."""
    per_sample = mode.memory(sizes)
    if mode.column_memory is None:
        cap = mode.max_chunk or slice_n
        chunk = max(1, min(slice_n, budget // max(1, per_sample), cap))
        return chunk, sizes.params, chunk * per_sample
    # The J block of the chunk, plus c tangents through the network.
    per_column = mode.column_memory(sizes)
    chunk = max(1, min(slice_n, budget // max(1, per_sample + per_column)))
    param_chunk = max(
        1, min(sizes.params, (budget - chunk * per_sample) // max(1, chunk * per_column))
    )
    return chunk, param_chunk, chunk * (per_sample + param_chunk * per_column)


def _plan(
    strategy: str,
    mode: str,
    reasons: list[str],
    problem: _Problem,
    *,
    chunking: tuple[int, int, int],
    cap_slices: bool,
    flops: tuple[int, int],
    system: str = "",
) -> JacobianPlan:
    """The plan of ``strategy`` and ``mode`` with its chunking, a slice capped at one chunk
    (``cap_slices``) where the slice holds more."""
    chunk, param_chunk, chunk_bytes = chunking
    slice_cap = problem.slice_n
    if cap_slices and chunk < problem.slice_n:
        slice_cap = chunk
        reasons.append(f"slices of {chunk} samples (no slice_size: one chunk per slice)")
    if system:
        reasons.append(system)
    return JacobianPlan(
        strategy=strategy,
        mode=mode,
        reason="; ".join(reasons),
        rows=problem.rows,
        params=problem.params,
        outputs_per_sample=problem.m,
        samples_per_chunk=chunk,
        param_chunk=param_chunk,
        chunk_bytes=int(chunk_bytes),
        memory_budget=problem.budget,
        slice_samples=slice_cap,
        product_flops=int(flops[0]),
        factor_flops=int(flops[1]),
    )
