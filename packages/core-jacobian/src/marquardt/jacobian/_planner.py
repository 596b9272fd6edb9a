"""Choosing the product strategy and the Jacobian mode, within a memory budget.

Strategy. With ``R = N·m`` residual rows and ``P`` parameters, the LM step solves
``(JᵀJ + λD)δ = Jᵀr`` when ``R ≥ P`` (Marquardt 1963), which needs only the ``P×P`` and
``P`` sums ``Σ_s J_sᵀJ_s`` and ``Σ_s J_sᵀr_s`` (``accumulate``: memory ``O(P²)``,
independent of ``N``); when ``R < P`` the ``R×R`` system ``(JJᵀ + λI)u = r``,
``δ = Jᵀu`` needs ``J`` itself (``explicit``).

Mode. The costs, for ``b`` samples, ``a`` activations per sample:

* ``layers``: one forward and ``m`` backward passes over the whole chunk, then outer
  products; extra memory ``≈ b·(m·P + 2a)`` numbers. The fastest when it applies.
* ``vmap``: per-sample ``jacrev``; memory ``≈ b·(3·m·P + (m+1)·a)`` per call.
* ``broadcast``: per-sample copies of the parameters (models that declare it), one
  forward and ``m`` backward passes; memory ``≈ b·((m+1)·P + 3a)``, chunks of at most
  ``BROADCAST_CHUNK`` samples so the element-wise work stays in cache. Chosen first.
* Residuals that differentiate the model by its inputs (``PointResidual``) keep, per
  sample, the graph of those derivatives: ``input_graph`` times the activations (for a
  Hessian by forward-over-reverse in ``d`` dimensions, ``2(d + 1)``), used in ``a`` above.
* ``jacfwd``: ``P`` forward-mode passes; memory ``≈ b·c·(2a + m)`` for ``c`` columns
  per call. Chosen automatically only when ``P < m`` (forward mode wins when there
  are fewer inputs than outputs); always chunked over columns and samples, because
  forward mode over a whole large slice is what exhausts time and memory.

Slices. An explicit ``slice_size`` is kept. Without one (``slice_size=None``) the engine
gives each device ``⌈N/D⌉`` samples; for ``accumulate`` the planner then caps a slice at
one chunk (``slice_samples = samples_per_chunk``), so a device never holds more than one
budget's worth of ``J_s`` and workspace whatever ``N`` is: peak memory is flat in ``N``.
``explicit`` keeps the whole-slice semantics (the backend holds ``J`` anyway).

``matrix_free`` never forms ``J``: each conjugate-gradient iteration of the step takes one
Jacobian-vector and one vector-Jacobian product per chunk (``_gauss_newton``). A chunk
holds ``≈ b·(PRODUCT_ACTIVATIONS·a + m)`` numbers besides a few ``P``-vectors, so memory
is ``O(P + b·a)``; slices are capped at one chunk as for ``accumulate``. The planner only
makes it when asked (``strategy="matrix_free"``): whether ``P × P`` or ``R × R`` fits is
the solver's question (it knows the memory of the device it solves on).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._errors import UnknownModeError, message
from ._modes._broadcast import BROADCAST_CHUNK

__all__ = ["MODES", "STRATEGIES", "JacobianPlan", "plan_jacobian"]

MODES = ("auto", "vmap", "jacfwd", "layers", "broadcast")
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


def _check(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise UnknownModeError(
            message(
                f"the Jacobian {what} {value!r} was requested",
                f"the known ones are {', '.join(allowed)}",
                f"pass one of {', '.join(allowed)}",
            )
        )
    return value


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
) -> JacobianPlan:
    """Choose ``strategy`` and ``mode`` for ``rows`` residual rows and ``params`` parameters.

    Chunks never exceed ``slice_samples``, and never exceed ``memory_budget`` bytes by the
    estimates in this module's docstring (at least one sample and one column always run).

    Arguments:
        rows: ``R = N·m``, the residual rows.
        params: ``P``, the parameters (columns of ``J``).
        outputs_per_sample: ``m``, the residual rows per sample.
        dtype: the dtype of ``J``.
        memory_budget: the bytes a chunk's intermediates may take.
        strategy: ``auto`` (``explicit`` when ``R < P``, else ``accumulate``),
            ``explicit``, ``accumulate`` or ``matrix_free`` (never chosen by ``auto``).
        mode: ``auto``, ``vmap``, ``jacfwd``, ``layers`` or ``broadcast``.
        layers_supported: whether every layer has a per-sample rule (``layers``).
        layers_reason: why (or why not), for the plan's reason.
        broadcast_supported: whether the model declares per-sample parameter copies
            (``broadcast``, chosen first where supported).
        broadcast_reason: why (or why not), for the plan's reason.
        activations_per_sample: ``a``, the activations of one sample; default ``P``.
        slice_samples: the largest slice a device will get; default: all samples.
        cap_slices: the caller has no ``slice_size``: an ``accumulate`` (or
            ``matrix_free``) slice is capped at one chunk, so its memory is bounded by the
            budget and independent of ``rows``.
        input_graph: for residuals that differentiate the model by its inputs, the size
            of the input-derivative graph, which multiplies the activations per sample.

    Returns:
        The plan, with its reasons in words.

    Raises:
        UnknownModeError: ``strategy`` or ``mode`` is not one of the known ones.
    """
    _check(strategy, STRATEGIES, "strategy")
    _check(mode, MODES, "mode")
    m = max(1, outputs_per_sample)
    samples = max(1, rows // m)
    slice_n = max(1, min(slice_samples or samples, samples))
    item = torch.empty((), dtype=dtype).element_size()
    act = activations_per_sample if activations_per_sample is not None else params
    act = max(1, act) * max(1, input_graph)
    budget = max(1, memory_budget)
    reasons: list[str] = []

    if strategy == "auto":
        if rows < params:
            strategy = "explicit"
            reasons.append(f"explicit: {rows} rows < {params} parameters (J is needed whole)")
        else:
            strategy = "accumulate"
            reasons.append(f"accumulate: {rows} rows >= {params} parameters (JᵀJ is O(P²))")
    else:
        reasons.append(f"{strategy}: forced")

    if strategy == "matrix_free":
        return _matrix_free_plan(
            rows, params, m, samples, slice_n, item, act, budget, reasons, cap_slices
        )
    if mode == "broadcast" and not broadcast_supported:
        mode = "jacfwd"
        reasons.append("jacfwd: broadcast was requested but " + broadcast_reason)
    elif mode in ("auto", "broadcast") and broadcast_supported:
        mode = "broadcast"
        reasons.append("broadcast: " + broadcast_reason)
    elif mode == "auto":
        if layers_supported:
            mode = "layers"
            reasons.append("layers: " + (layers_reason or "every layer has a per-sample rule"))
        elif params < m:
            mode = "jacfwd"
            reasons.append(
                f"jacfwd: {params} parameters < {m} outputs per sample; " + layers_reason
            )
        else:
            mode = "vmap"
            reasons.append("vmap: " + (layers_reason or "no per-sample rule applies"))
    elif mode == "layers" and not layers_supported:
        mode = "vmap"
        reasons.append("vmap: layers was requested but " + layers_reason)
    else:
        reasons.append(f"{mode}: forced")

    if input_graph > 1:
        reasons.append(f"input-derivative graph: {input_graph}× the activations per sample")
    param_chunk = params
    if mode == "broadcast":
        per_sample = item * ((m + 1) * params + 3 * act)
        chunk = max(1, min(slice_n, budget // per_sample, BROADCAST_CHUNK))
        chunk_bytes = chunk * per_sample
    elif mode == "layers":
        per_sample = item * (m * params + 2 * act * m)
        chunk = max(1, min(slice_n, budget // per_sample))
        chunk_bytes = chunk * per_sample
    elif mode == "vmap":
        per_sample = item * (3 * m * params + (m + 1) * act)
        chunk = max(1, min(slice_n, budget // per_sample))
        chunk_bytes = chunk * per_sample
    else:
        # Forward mode: the J block of the chunk plus c tangents through the network.
        per_column_sample = item * (2 * act + m)
        chunk = max(1, min(slice_n, budget // max(1, item * m * params + per_column_sample)))
        param_chunk = max(
            1,
            min(params, (budget - chunk * item * m * params) // max(1, chunk * per_column_sample)),
        )
        chunk_bytes = chunk * (item * m * params + param_chunk * per_column_sample)
    reasons.append(
        f"chunks of {chunk} samples"
        + (f" × {param_chunk} columns" if mode == "jacfwd" else "")
        + f" (≈{chunk_bytes / 2**20:.1f} MiB of {budget / 2**20:.1f} MiB budget)"
    )
    slice_cap = slice_n
    if cap_slices and strategy == "accumulate" and chunk < slice_n:
        slice_cap = chunk
        reasons.append(f"slices of {chunk} samples (no slice_size: one chunk per slice)")
    n = params if strategy == "accumulate" or rows >= params else rows
    product_flops = rows * params * n
    factor_flops = n**3 // 3
    reasons.append(
        f"{n}×{n} system: Gram product ≈{product_flops / 1e9:.3g} GFLOP per step, "
        f"Cholesky ≈{factor_flops / 1e9:.3g} GFLOP per attempt"
    )
    return JacobianPlan(
        strategy=strategy,
        mode=mode,
        reason="; ".join(reasons),
        rows=rows,
        params=params,
        outputs_per_sample=m,
        samples_per_chunk=chunk,
        param_chunk=param_chunk,
        chunk_bytes=int(chunk_bytes),
        memory_budget=budget,
        slice_samples=slice_cap,
        product_flops=int(product_flops),
        factor_flops=int(factor_flops),
    )


def _matrix_free_plan(
    rows: int,
    params: int,
    m: int,
    samples: int,
    slice_n: int,
    item: int,
    act: int,
    budget: int,
    reasons: list[str],
    cap_slices: bool,
) -> JacobianPlan:
    """The plan of a ``matrix_free`` step (see the module docstring): chunks of samples
    whose product workspace fits the budget; no mode (``J`` is never formed)."""
    per_sample = item * (PRODUCT_ACTIVATIONS * act + 2 * m)
    chunk = max(1, min(slice_n, budget // per_sample))
    chunk_bytes = chunk * per_sample
    reasons.append(
        f"products: one jvp and one vjp per chunk of {chunk} samples per CG iteration "
        f"(≈{chunk_bytes / 2**20:.1f} MiB of {budget / 2**20:.1f} MiB budget), J never formed"
    )
    slice_cap = slice_n
    if cap_slices and chunk < slice_n:
        slice_cap = chunk
        reasons.append(f"slices of {chunk} samples (no slice_size: one chunk per slice)")
    return JacobianPlan(
        strategy="matrix_free",
        mode="products",
        reason="; ".join(reasons),
        rows=rows,
        params=params,
        outputs_per_sample=m,
        samples_per_chunk=chunk,
        param_chunk=params,
        chunk_bytes=int(chunk_bytes),
        memory_budget=budget,
        slice_samples=slice_cap,
        # One Gauss-Newton product: ≈ 3 forwards and 2 backwards' worth of 2·R·P flops.
        product_flops=int(2 * rows * params * 5),
        factor_flops=0,
    )
