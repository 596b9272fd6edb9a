"""Strategy ``accumulate``: ``JᵀJ = Σ_s J_sᵀJ_s``, ``Jᵀr = Σ_s J_sᵀr_s`` and ``rᵀr``,
summed slice by slice on every model device and then added on ``devices[0]``.

No more than one chunk of ``J`` exists per device at a time, so memory does not grow with
the batch: the products are ``P × P`` whatever ``N`` (Marquardt 1963; Gavin's LM notes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from . import _gram_threads
from ._columns import ColumnSubset
from ._errors import ResidualNotFiniteError, message
from ._forward import forward_slices
from ._gram import GramAccumulator, choose_kernel
from ._modes import MODE_TABLE
from ._planner import JacobianPlan
from ._points import AnyResidual
from ._products import NormalProducts
from ._replicas import Replicas
from ._slice_work import Workspaces, jacobian_chunks
from ._slicing import DeviceWorkers, slice_ranges, to_device

__all__ = ["accumulate_products"]


def accumulate_products(
    replicas: Replicas,
    residual_fn: AnyResidual,
    workers: DeviceWorkers,
    workspaces: Workspaces,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    plan: JacobianPlan,
    *,
    batch: int,
    size: int,
    dtype: torch.dtype,
    columns: ColumnSubset | None = None,
) -> NormalProducts:
    """The normal products of the batch in ``dtype``, with the seconds spent (jacobian,
    gram, reduce, transfer). Slices of ``size`` samples go round-robin to the devices.

    Residuals are not scanned chunk by chunk (on a GPU each scan is a host
    synchronisation): ``rᵀr`` is finite exactly when every residual is, so it is tested
    once, and only a non-finite sum pays a forward pass to name the first bad sample.
    With ``columns`` the products are those of ``J_S`` (``k × k``, ``k``), and only the
    ``k`` columns are ever formed.
    """
    params = replicas.num_params if columns is None else columns.size
    # The rows of a full chunk, which choose the Gram kernel.
    chunk_rows = min(plan.samples_per_chunk, size, batch) * plan.outputs_per_sample
    threaded = any(
        choose_kernel(device, params, chunk_rows, dtype) == "numpy-threads"
        for device in replicas.devices
    )
    accumulators: dict[int, GramAccumulator] = {}
    chunk_buffers: dict[int, torch.Tensor | None] = {}
    start = time.perf_counter()
    gram_seconds = [0.0] * len(replicas)

    def job(dev: int, lo: int, hi: int) -> None:
        replica = replicas[dev]
        if dev not in accumulators:
            accumulators[dev] = GramAccumulator(params, replica.device, dtype, chunk_rows)
            rows = min(plan.samples_per_chunk, hi - lo) * plan.outputs_per_sample
            chunk_buffers[dev] = (
                workspaces.get(dev, rows, params, replicas.dtype, replica.device)
                if MODE_TABLE[plan.mode].writes_out
                else None
            )
        acc = accumulators[dev]
        x = to_device(inputs[lo:hi], replica.device)
        y = to_device(targets[lo:hi], replica.device)
        chunks = jacobian_chunks(
            replica, residual_fn, x, y, plan, chunk_buffers[dev], lo, check=False, columns=columns
        )
        for jac, res in chunks:
            t0 = time.perf_counter()
            acc.add(jac, res)
            gram_seconds[dev] += time.perf_counter() - t0

    jobs = [(lambda dev, lo=lo, hi=hi: job(dev, lo, hi)) for lo, hi in slice_ranges(batch, size)]
    # The threaded kernel's spin rule spans the Jacobian too: its last kernel's workers
    # are the ones that would spin beside the syrk.
    with _gram_threads.short_openmp_spin(threaded):
        workers.run_all(jobs)
    t_reduce = time.perf_counter()
    home = replicas.devices[0]
    accs = [accumulators[i] for i in sorted(accumulators)]
    jtj = accs[0].finish().to(home)
    jtr = accs[0].jtr.to(home)
    rss = accs[0].rss.to(home)
    for a in accs[1:]:
        jtj = jtj + a.finish().to(home)
        jtr = jtr + a.jtr.to(home)
        rss = rss + a.rss.to(home)
    rows = sum(a.rows for a in accs)
    rss_value = float(rss)
    if not math.isfinite(rss_value):
        _raise_first_non_finite(
            lambda: forward_slices(
                replicas,
                residual_fn,
                workers,
                inputs,
                targets,
                batch=batch,
                size=size,
                loss_fn=None,
                keep_residuals=False,
                output_device=replicas.devices[0],
            )
        )
    end = time.perf_counter()
    timings = {
        "jacobian": end - start,
        "gram": sum(gram_seconds),
        "reduce": end - t_reduce,
        "transfer": 0.0,
    }
    return NormalProducts(jtj=jtj, jtr=jtr, rss=rss_value, rows=rows, timings=timings)


def _raise_first_non_finite(checked_forward: Callable[[], object]) -> None:
    """Raise the residual check's error for the first non-finite residual of the batch.

    Called when ``rᵀr`` is not finite: ``checked_forward``, a forward pass that checks the
    residuals, names the sample. When the residuals are finite but their squares
    overflowed, the sum's error is raised.
    """
    checked_forward()
    raise ResidualNotFiniteError(
        message(
            "a finite sum of squared residuals was expected",
            "every residual is finite but rᵀr overflowed",
            "scale the residuals down (e.g. divide residual_fn by a constant) or use float64",
        )
    )
