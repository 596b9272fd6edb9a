"""Residuals, Jacobian slices and normal products, data-parallel over model devices.

For a batch of ``N`` samples and ``residual_fn(model(x_i), y_i) ∈ ℝᵐ`` the engine forms
the residual vector ``r ∈ ℝᴿ`` (``R = N·m``, sample-major) and its Jacobian
``J = ∂r/∂θ ∈ ℝᴿˣᴾ`` with respect to the flat trainable parameters ``θ``, slice by
slice on every device at once, and hands out either the slices of ``J`` (``explicit``)
or the sums ``JᵀJ = Σ_s J_sᵀJ_s``, ``Jᵀr = Σ_s J_sᵀr_s`` reduced to ``devices[0]``
(``accumulate``), as the Levenberg-Marquardt step needs (Marquardt 1963; Nielsen 1999;
Gavin, "The Levenberg-Marquardt algorithm for nonlinear least squares").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import torch

from ._accumulate import accumulate_products
from ._columns import ColumnSubset
from ._engine_plan import BatchPlanner
from ._errors import message
from ._forward import ForwardSlice, LossFn, batch_loss, forward_slices
from ._gauss_newton import GaussNewtonProducts, gauss_newton_products
from ._grad_mode import keeps_grad_mode
from ._host_heap import keep_host_heap
from ._planner import JacobianPlan
from ._points import AnyResidual
from ._prepared import PreparedBatch
from ._products import JacobianSlice, NormalProducts, SliceStream
from ._replicas import Replicas
from ._slice_work import Workspaces, slice_jacobian
from ._slicing import DeviceWorkers
from ._validate import check_batch, check_batchnorm, check_engine, check_slice_size

__all__ = ["JacobianEngine"]


class JacobianEngine:
    """Computes ``r`` and ``J = ∂r/∂θ`` (or ``JᵀJ``, ``Jᵀr``) on every replica's device.

    A step prepares its batch once ([`prepare`][marquardt.jacobian.JacobianEngine.prepare]:
    checks, one probe forward, one plan) and every call of that step reuses it. After each
    call, ``last_plan`` says what was chosen and why; the seconds spent come back with the
    products (``NormalProducts.timings``, ``SliceStream.timings``).

    Arguments:
        replicas: the model on its devices (`Replicas`); ``θ`` is its flat parameters.
        residual_fn: ``(output, target) -> residuals`` per sample, or a `PointResidual`.
        mode: how ``J`` is formed: ``"auto"``, ``"vmap"``, ``"jacfwd"``, ``"layers"`` or
            ``"broadcast"`` (``MARQUARDT_JACOBIAN_MODE`` forces one over ``"auto"``).
        memory_budget: the intermediate bytes of one chunk on one device (default from
            ``MARQUARDT_JACOBIAN_MEMORY_BUDGET``, else 256 MiB on CPU, half the free GPU
            memory). Without a ``slice_size`` the budget also caps ``accumulate`` slices
            (one chunk each) and forward-only slices (loss, residuals), so memory does not
            grow with the batch.
        output_device: where explicit slices and residuals are handed out (default
            ``devices[0]``).

    Raises:
        TypeError: ``replicas`` is not a `Replicas`, or ``residual_fn`` is neither a
            function nor a `PointResidual`.
        UnknownModeError: a mode outside the list above.
        ParameterDtypeError: a `PointResidual` whose dtype is not the model's.
        ValueError: a ``memory_budget`` that is not positive.
    """

    def __init__(
        self,
        replicas: Replicas,
        residual_fn: AnyResidual,
        *,
        mode: str = "auto",
        memory_budget: int | None = None,
        output_device: torch.device | str | None = None,
    ) -> None:
        chosen = check_engine(replicas, residual_fn, mode, memory_budget)
        self.replicas = replicas
        self.residual_fn = residual_fn
        self.mode = chosen
        self.memory_budget = memory_budget
        self.output_device = (
            torch.device(output_device) if output_device is not None else replicas.devices[0]
        )
        self._planner = BatchPlanner(replicas, residual_fn, chosen, memory_budget)
        self._workers = DeviceWorkers(replicas.devices)
        self._workspaces = Workspaces()
        if any(d.type == "cpu" for d in replicas.devices):
            keep_host_heap()  # each step's freed host blocks serve the next step

    # -- checks and planning -----------------------------------------------------------
    @keeps_grad_mode
    def prepare(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None = None,
        *,
        strategy: str = "auto",
        checked: bool = False,
        columns: ColumnSubset | None = None,
    ) -> PreparedBatch:
        """Check the batch, probe the model once and plan: what one step's calls reuse.

        Raises before any work on a bad batch (lengths, NaN/inf, slice size, batch norm in
        training mode, residuals that are detached or not finite on the first samples).
        ``checked=True`` skips the scan for NaN/inf in inputs and targets, for a caller that
        made it already (``LMA.step`` does, with its own message). The plan is kept in
        ``last_plan``. ``columns`` (from [`columns`][marquardt.jacobian.JacobianEngine.columns]) restricts the step's products to
        those parameter columns: the plan is made for their number ``k``, and only they
        are formed.
        """
        batch = check_batch(inputs, targets, scan=not checked)
        size = check_slice_size(slice_size, batch, len(self.replicas))
        check_batchnorm(self.replicas.model)
        plan = self._planner.plan(
            self.residual_fn,
            inputs,
            targets,
            batch,
            size,
            strategy,
            cap=slice_size is None,
            params=None if columns is None else columns.size,
        )
        return PreparedBatch(
            inputs=inputs,
            targets=targets,
            samples=batch,
            plan=plan,
            slice_samples=plan.slice_samples or size,
            forward_samples=self._planner.forward_size(size, capped=slice_size is None),
            columns=columns,
        )

    def columns(self, indices: torch.Tensor | Sequence[int]) -> ColumnSubset:
        """The subset of flat parameter ``indices`` (the order of ``replicas.names``),
        checked, for [`prepare`][marquardt.jacobian.JacobianEngine.prepare]."""
        return ColumnSubset.of(indices, self.replicas[0].sizes)

    @property
    def last_plan(self) -> JacobianPlan | None:
        """The plan of the last batch prepared (None before the first): what was chosen
        and why."""
        return self._planner.last_plan

    def rows_per_sample(self, inputs: torch.Tensor, targets: torch.Tensor) -> int:
        """``m``: residual rows per sample (checks the batch and residual_fn first)."""
        check_batch(inputs, targets)
        check_batchnorm(self.replicas.model)
        return self._planner.probe(self.residual_fn, inputs, targets)[0]

    def plan(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None = None,
        *,
        strategy: str = "auto",
    ) -> JacobianPlan:
        """Check the batch and choose strategy, mode and chunking (kept in ``last_plan``)."""
        return self.prepare(inputs, targets, slice_size, strategy=strategy).plan

    def _with_strategy(self, batch: PreparedBatch, strategy: str) -> PreparedBatch:
        if batch.strategy == strategy:
            return batch
        raise ValueError(
            message(
                f"a batch prepared for strategy {strategy!r} was expected",
                f"it was prepared for {batch.strategy!r}",
                f"prepare it with engine.prepare(x, y, strategy={strategy!r})",
            )
        )

    # -- public products ---------------------------------------------------------------
    def slices(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None = None
    ) -> SliceStream:
        """Strategy ``explicit``: the slices of ``J`` and ``r`` in row order.

        Everything is checked (batch, slice size, residual shape, finiteness on the
        first samples) before the first slice is computed. Each slice's tensors are new
        and never written again by the engine. The stream's ``timings`` say where the
        seconds went.
        """
        return self.jacobian_slices(self.prepare(inputs, targets, slice_size, strategy="explicit"))

    def jacobian_slices(self, batch: PreparedBatch) -> SliceStream:
        """The slices of ``J`` and ``r`` of a batch prepared for ``explicit``, in row order."""
        plan = self._with_strategy(batch, "explicit").plan
        timings = {"jacobian": 0.0, "transfer": 0.0}
        jobs = self._slice_jobs(batch, plan, self.output_device)
        stream = self._yield_slices(jobs, batch.slices(), plan.outputs_per_sample, timings)
        return SliceStream(stream, timings)

    def _slice_jobs(
        self,
        batch: PreparedBatch,
        plan: JacobianPlan,
        output_device: torch.device,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> list[Callable[[int], tuple[torch.Tensor, torch.Tensor, float]]]:
        """One job per slice of ``batch``: ``(J_s, r_s, transfer seconds)`` on the device
        it is given, handed out on ``output_device`` or written into ``out``."""

        def bound(lo: int, hi: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor, float]]:
            return lambda dev: slice_jacobian(
                self.replicas[dev],
                self.residual_fn,
                batch.inputs,
                batch.targets,
                lo,
                hi,
                plan,
                params=batch.params,
                dtype=self.replicas.dtype,
                output_device=output_device,
                out=out,
                columns=batch.columns,
            )

        return [bound(lo, hi) for lo, hi in batch.slices()]

    def _yield_slices(
        self,
        jobs: Sequence[Callable[[int], tuple[torch.Tensor, torch.Tensor, float]]],
        ranges: list[tuple[int, int]],
        m: int,
        timings: dict[str, float],
    ) -> Iterator[JacobianSlice]:
        start = time.perf_counter()
        for (lo, hi), (jac, res, transfer) in zip(
            ranges, self._workers.map_ordered(jobs), strict=True
        ):
            timings["transfer"] += transfer
            timings["jacobian"] = time.perf_counter() - start
            yield JacobianSlice(start=lo * m, stop=hi * m, jacobian=jac, residuals=res)

    @keeps_grad_mode
    def fill_jacobian(
        self, batch: PreparedBatch, jacobian: torch.Tensor, residuals: torch.Tensor
    ) -> dict[str, float]:
        """Write ``J`` (``R × P``) and ``r`` (``R``) of a batch prepared for ``explicit``
        into the given tensors, slice by slice; returns the seconds spent.

        Slices computed on the tensors' own device are written in place (no slice-sized
        copy); the others are copied into their rows. ``jacobian`` must be in the
        parameters' dtype for the in-place path.
        """
        plan = self._with_strategy(batch, "explicit").plan
        rows, params = plan.rows, batch.params
        if tuple(jacobian.shape) != (rows, params) or tuple(residuals.shape) != (rows,):
            raise ValueError(
                message(
                    f"tensors of shapes ({rows}, {params}) and ({rows},) were expected",
                    f"got {tuple(jacobian.shape)} and {tuple(residuals.shape)}",
                    "allocate J as R × P and r as R for the prepared batch (plan.rows)",
                )
            )
        start = time.perf_counter()
        jobs = self._slice_jobs(batch, plan, jacobian.device, (jacobian, residuals))
        transfers = [part[2] for part in self._workers.run_all(jobs)]
        return {"jacobian": time.perf_counter() - start, "transfer": float(sum(transfers))}

    @keeps_grad_mode
    def jacobian(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole ``J`` (``R × P``) and ``r`` (``R``) on the output device."""
        parts = list(self.slices(inputs, targets, slice_size))
        if len(parts) == 1:
            return parts[0].jacobian, parts[0].residuals
        return torch.cat([p.jacobian for p in parts]), torch.cat([p.residuals for p in parts])

    @keeps_grad_mode
    def accumulate(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None = None,
        *,
        dtype: torch.dtype | None = None,
    ) -> NormalProducts:
        """Strategy ``accumulate``: ``JᵀJ``, ``Jᵀr``, ``rᵀr`` on ``devices[0]``.

        Each device sums ``J_sᵀJ_s`` over its slices (in chunks bounded by the memory
        budget, so no more than one chunk of ``J`` exists per device at a time); the
        per-device sums are then added on ``devices[0]``. ``dtype`` is the accumulation
        dtype (default: the parameters' dtype; ``torch.float64`` for accuracy).
        """
        prepared = self.prepare(inputs, targets, slice_size, strategy="accumulate")
        return self.normal_products(prepared, dtype=dtype)

    @keeps_grad_mode
    def normal_products(
        self, batch: PreparedBatch, *, dtype: torch.dtype | None = None
    ) -> NormalProducts:
        """``JᵀJ``, ``Jᵀr``, ``rᵀr`` of a batch prepared for ``accumulate`` (see
        [`accumulate`][marquardt.jacobian.JacobianEngine.accumulate]), with the seconds spent in ``NormalProducts.timings``."""
        plan = self._with_strategy(batch, "accumulate").plan
        acc_dtype = dtype or self.replicas.dtype
        if not acc_dtype.is_floating_point:
            raise TypeError(
                message(
                    f"accumulation in {acc_dtype} was requested",
                    "it is not a floating dtype",
                    "pass torch.float32 or torch.float64, or None for the model dtype",
                )
            )
        return accumulate_products(
            self.replicas,
            self.residual_fn,
            self._workers,
            self._workspaces,
            batch.inputs,
            batch.targets,
            plan,
            batch=batch.samples,
            size=batch.slice_samples,
            dtype=acc_dtype,
            columns=batch.columns,
        )

    @keeps_grad_mode
    def gauss_newton(
        self, batch: PreparedBatch, *, probes: int = 4, seed: int = 0, row_offset: int = 0
    ) -> GaussNewtonProducts:
        """Strategy ``matrix_free``: ``Jᵀr``, ``rᵀr``, ``probes`` Hutchinson products ``Jᵀz``
        for the estimate of ``diag(JᵀJ)``, and the operator ``v ↦ JᵀJv``, of a batch
        prepared for ``matrix_free``; ``J`` is never formed (see ``GaussNewtonProducts``).

        ``seed`` and ``row_offset`` (the first global row's sample index, for a share of a
        larger batch) fix the probes' signs by global row. Raises
        ``ResidualNotFiniteError`` on a NaN or infinite residual.
        """
        self._with_strategy(batch, "matrix_free")
        if batch.columns is not None:
            raise ValueError(
                message(
                    "matrix-free products of all parameters were requested",
                    f"the batch was prepared for a subset of {batch.columns.size} columns",
                    "prepare the batch without columns= for strategy 'matrix_free'",
                )
            )
        return gauss_newton_products(
            self.replicas,
            self.residual_fn,
            self._workers,
            batch,
            probes=probes,
            seed=seed,
            row_offset=row_offset,
            jacobian_of=lambda index: self.jacobian(batch.inputs[index], batch.targets[index])[0],
        )

    @keeps_grad_mode
    def residuals(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None = None
    ) -> torch.Tensor:
        """All residual rows (``R``, sample-major) on the output device, without ``J``."""
        parts = self._forward_slices(inputs, targets, slice_size, None, keep_residuals=True)
        kept = [p[0] for p in parts if p[0] is not None]
        return torch.cat(kept) if len(kept) > 1 else kept[0]

    @keeps_grad_mode
    def loss(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None = None,
        loss_fn: LossFn | None = None,
    ) -> float:
        """The batch loss without any Jacobian, computed in slices on every device.

        Default: the mean of squared residuals ``rᵀr / R``. A ``loss_fn(output, target)``
        must return the mean over the samples it is given; slices are weighted by their
        number of samples. Only per-slice sums survive a slice: keeping each slice's
        residuals until the end pins the host heap between the slices' freed activation
        blocks, and resident memory then grows with the number of slices.
        """
        parts = self._forward_slices(inputs, targets, slice_size, loss_fn, keep_residuals=False)
        return float(batch_loss(parts, self.replicas.devices[0], custom=loss_fn is not None))

    @keeps_grad_mode
    def batch_loss(self, batch: PreparedBatch, loss_fn: LossFn | None = None) -> torch.Tensor:
        """The loss of a prepared batch at the current parameters, as a 0-dim float64
        tensor on ``devices[0]`` (no host synchronisation; see [`loss`][marquardt.jacobian.JacobianEngine.loss]).

        The residuals are not scanned for NaN/inf: a non-finite residual makes the loss
        non-finite, which is what a trial point of an LM step needs to know.
        """
        parts = forward_slices(
            self.replicas,
            self.residual_fn,
            self._workers,
            batch.inputs,
            batch.targets,
            batch=batch.samples,
            size=batch.forward_samples,
            loss_fn=loss_fn,
            keep_residuals=False,
            output_device=self.output_device,
            check_residuals=False,
        )
        return batch_loss(parts, self.replicas.devices[0], custom=loss_fn is not None)

    def _forward_slices(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None,
        loss_fn: LossFn | None,
        *,
        keep_residuals: bool,
    ) -> list[ForwardSlice]:
        """Per slice: (residuals if kept, loss sum or loss_fn value, rows, samples)."""
        batch = check_batch(inputs, targets)
        size = check_slice_size(slice_size, batch, len(self.replicas))
        check_batchnorm(self.replicas.model)
        if slice_size is None and self._planner.activations is None:
            self._planner.probe(self.residual_fn, inputs, targets)
        size = self._planner.forward_size(size, capped=slice_size is None)
        return forward_slices(
            self.replicas,
            self.residual_fn,
            self._workers,
            inputs,
            targets,
            batch=batch,
            size=size,
            loss_fn=loss_fn,
            keep_residuals=keep_residuals,
            output_device=self.output_device,
        )

    def close(self) -> None:
        """Stop the device worker threads (they are also stopped at exit); free buffers."""
        self._workers.close()
        self._workspaces.clear()
