"""The work on one slice of a batch, on one model device: rows of ``J`` and ``r``.

A slice of ``s`` samples gives ``s·m`` residual rows and their Jacobian rows
``J_s = ∂r_s/∂θ`` (``s·m × P``). It is computed in chunks of at most
``plan.samples_per_chunk`` samples, so that one chunk's intermediates fit the memory budget,
by the mode the planner chose, through its entry of the mode table (``_modes._table``),
which holds the mode's function for each residual form it serves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from ._columns import ColumnSubset
from ._modes import MODE_TABLE, ModeCall
from ._planner import JacobianPlan
from ._points import AnyResidual
from ._replicas import Replica
from ._slicing import to_device, to_host_fresh
from ._validate import check_finite_residuals

__all__ = ["Workspaces", "jacobian_chunks", "slice_jacobian"]


def jacobian_chunks(
    replica: Replica,
    residual_fn: AnyResidual,
    x: torch.Tensor,
    y: torch.Tensor,
    plan: JacobianPlan,
    workspace: torch.Tensor | None = None,
    first_sample: int = 0,
    *,
    fill: bool = False,
    check: bool = True,
    columns: ColumnSubset | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(J, r)`` of successive chunks of at most ``plan.samples_per_chunk`` samples.

    With a ``workspace`` (``samples_per_chunk·m × P``, accumulate only: nothing from
    it is handed out) the layers mode writes each chunk's ``J`` there, so memory is
    reused from chunk to chunk instead of being allocated and faulted in anew. With
    ``fill`` the workspace holds the whole slice's ``J`` and chunk ``c`` lands in its
    own rows (explicit: one slice-sized ``J``, no concatenation of chunk copies).
    ``check`` scans each chunk's residuals for NaN/inf (a host synchronisation per chunk
    on a GPU); a caller that checks a sum of the residuals instead passes False.
    With ``columns``, only those columns of ``J`` are formed (``_modes._subset``).

    Arguments:
        replica: the replica that differentiates.
        residual_fn: the residuals (of the outputs, or a ``PointResidual``).
        x: the slice's inputs, on the replica's device.
        y: the slice's targets, on the replica's device.
        plan: the planner's plan (mode, chunking).
        workspace: a buffer for ``J`` (see above), or None.
        first_sample: the batch index of ``x[0]``, for error messages.
        fill: the workspace holds the whole slice's ``J``.
        check: scan each chunk's residuals for NaN/inf.
        columns: the parameter subset whose columns alone are formed, or None.

    Returns:
        An iterator of ``(J, r)`` per chunk.
    """
    step = plan.samples_per_chunk
    m = plan.outputs_per_sample
    mode = MODE_TABLE[plan.mode]
    for lo in range(0, int(x.shape[0]), step):
        xs, ys = x[lo : lo + step], y[lo : lo + step]
        first = lo * m if fill else 0
        out = None if workspace is None else workspace[first : first + int(xs.shape[0]) * m]
        call = ModeCall(
            xs,
            ys,
            samples_per_call=step,
            param_chunk=plan.param_chunk,
            out=out if mode.writes_out else None,
            columns=columns,
        )
        jac, res = mode.jacobian(replica, residual_fn, call)
        if fill and out is not None and not mode.writes_out:
            jac = out.copy_(jac)
        if check:
            check_finite_residuals(res, plan.outputs_per_sample, first_sample + lo)
        yield jac, res


def slice_jacobian(
    replica: Replica,
    residual_fn: AnyResidual,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    lo: int,
    hi: int,
    plan: JacobianPlan,
    *,
    params: int,
    dtype: torch.dtype,
    output_device: torch.device,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    columns: ColumnSubset | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(J_s, r_s, transfer seconds)`` of samples ``[lo, hi)``, fresh on ``output_device``.

    With ``out`` = (J, r) of the whole batch, the slice's rows are written there instead
    (straight into J when it lives on the replica's device: no slice-sized copy) and the
    returned tensors are those rows. With ``columns``, ``J_s`` holds those columns only
    (``params`` is then their number).
    """
    device = replica.device
    x = to_device(inputs[lo:hi], device)
    y = to_device(targets[lo:hi], device)
    m = plan.outputs_per_sample
    jac_all: torch.Tensor | None = None
    if out is not None:
        jac_rows, res_rows = out[0][lo * m : hi * m], out[1][lo * m : hi * m]
        if jac_rows.device == device and jac_rows.dtype == dtype:
            parts = list(
                jacobian_chunks(
                    replica, residual_fn, x, y, plan, jac_rows, lo, fill=True, columns=columns
                )
            )
            start = time.perf_counter()
            res_rows.copy_(torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1])
            return jac_rows, res_rows, time.perf_counter() - start
        jac, res, _ = slice_jacobian(
            replica,
            residual_fn,
            inputs,
            targets,
            lo,
            hi,
            plan,
            params=params,
            dtype=dtype,
            output_device=device,
            columns=columns,
        )
        start = time.perf_counter()
        jac_rows.copy_(jac)
        res_rows.copy_(res)
        return jac_rows, res_rows, time.perf_counter() - start
    if hi - lo > plan.samples_per_chunk:
        # Several chunks: each writes its rows of one fresh slice-sized J.
        jac_all = torch.empty(
            (hi - lo) * plan.outputs_per_sample, params, dtype=dtype, device=device
        )
    parts = list(
        jacobian_chunks(replica, residual_fn, x, y, plan, jac_all, lo, fill=True, columns=columns)
    )
    if jac_all is None:
        jac, res = parts[0]
    else:
        jac = jac_all
        res = torch.cat([p[1] for p in parts])
    start = time.perf_counter()
    jac = to_host_fresh(jac, output_device)
    res = to_host_fresh(res, output_device)
    return jac, res, time.perf_counter() - start


class Workspaces:
    """Per-device buffers for the layers-mode ``J`` of one accumulate chunk, kept from call
    to call: a fresh chunk-sized buffer every step costs its page faults every step."""

    def __init__(self) -> None:
        self._held: dict[int, torch.Tensor] = {}

    def get(
        self, index: int, rows: int, params: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A ``rows × params`` buffer for replica ``index`` on ``device``, reused across calls."""
        held = self._held.get(index)
        if (
            held is None
            or held.dtype != dtype
            or held.device != device
            or held.shape[0] < rows
            or held.shape[1] != params  # a subset step of another size
        ):
            held = torch.empty(rows, params, dtype=dtype, device=device)
            self._held[index] = held
        return held[:rows]

    def clear(self) -> None:
        """Free every buffer."""
        self._held.clear()
