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

from . import _settings
from ._accumulate import accumulate_products
from ._columns import ColumnSubset
from ._errors import UnknownModeError, message
from ._forward import ForwardSlice, LossFn, batch_loss, forward_samples, forward_slices
from ._gauss_newton import GaussNewtonProducts, gauss_newton_products
from ._grad_mode import keeps_grad_mode
from ._host_heap import keep_host_heap
from ._modes import broadcast_support, layers_support
from ._modes._broadcast import BROADCAST_CHUNK
from ._plan_memo import PlanMemo
from ._planner import MODES, JacobianPlan, plan_jacobian
from ._points import AnyResidual, PointResidual
from ._prepared import PreparedBatch
from ._probe import default_budget, probe, probe_points, verify_broadcast, verify_layers
from ._products import JacobianSlice, NormalProducts, SliceStream
from ._replicas import Replicas
from ._slice_work import Workspaces, slice_jacobian
from ._slicing import DeviceWorkers
from ._validate import check_batch, check_batchnorm, check_slice_size

__all__ = ["JacobianEngine"]


class JacobianEngine:
    """Computes ``r`` and ``J = ∂r/∂θ`` (or ``JᵀJ``, ``Jᵀr``) on every replica's device.

    ``mode`` is ``"auto"``, ``"vmap"``, ``"jacfwd"``, ``"layers"`` or ``"broadcast"``;
    ``memory_budget`` bounds the intermediate bytes of one chunk on one device (default from
    ``MARQUARDT_JACOBIAN_MEMORY_BUDGET``, else 256 MiB on CPU, half the free GPU memory).
    Without a ``slice_size`` the budget also caps ``accumulate`` slices (one chunk each)
    and forward-only slices (loss, residuals), so memory does not grow with the batch.
    ``output_device`` is where explicit slices and residuals are handed out
    (default ``devices[0]``). After each call, ``last_plan`` says what was chosen and
    why; the seconds spent come back with the products (``NormalProducts.timings``,
    ``SliceStream.timings``). A step prepares its batch once ([`prepare`][marquardt.jacobian.JacobianEngine.prepare]: checks,
    one probe forward, one plan) and every call of that step reuses it.
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
        if not isinstance(replicas, Replicas):
            raise TypeError(
                message(
                    "JacobianEngine expects a Replicas object",
                    f"got {type(replicas).__name__}",
                    "wrap the model first: Replicas(model, devices)",
                )
            )
        if not callable(residual_fn) and not isinstance(residual_fn, PointResidual):
            raise TypeError(
                message(
                    "residual_fn was expected as a function (output, target) -> residuals "
                    "or a PointResidual",
                    f"got {type(residual_fn).__name__}",
                    "pass e.g. lambda a, b: a - b",
                )
            )
        if isinstance(residual_fn, PointResidual):
            residual_fn.check_model(replicas.dtype)
        forced = _settings.mode() if mode == "auto" else None
        chosen = forced or mode
        if chosen not in MODES:
            source = f"{_settings.ENV_MODE}={forced}" if forced else f"mode={mode!r}"
            raise UnknownModeError(
                message(
                    f"the Jacobian mode {source} was requested",
                    f"the known modes are {', '.join(MODES)}",
                    f"pass one of {', '.join(MODES)}",
                )
            )
        if memory_budget is not None and memory_budget <= 0:
            raise ValueError(
                message(
                    f"memory_budget={memory_budget} bytes was requested",
                    "it is not positive",
                    "pass a positive number of bytes, or None for the default",
                )
            )
        self.replicas = replicas
        self.residual_fn = residual_fn
        self.mode = chosen
        self.memory_budget = memory_budget
        self.output_device = (
            torch.device(output_device) if output_device is not None else replicas.devices[0]
        )
        self.last_plan: JacobianPlan | None = None
        self._memo = PlanMemo()  # the same batch, unchanged, is probed and planned once
        self._workers = DeviceWorkers(replicas.devices)
        self._workspaces = Workspaces()
        # Activations per sample from the last probe: sizes forward-only slices.
        self._activations: int | None = None
        self._graph = 1  # the input-derivative graph, in activations (PointResidual)
        supported, why = layers_support(replicas.model)
        declared, why_not = broadcast_support(replicas.model)
        if isinstance(residual_fn, PointResidual):
            # Both read the outputs' graph alone; the residual differentiates by the inputs.
            supported = declared = False
            why = why_not = "the residual differentiates the model by its inputs (PointResidual)"
        self._layers_ok: bool | None = None if supported else False
        self._layers_reason = why
        self._broadcast_ok: bool | None = None if declared else False
        self._broadcast_reason = why_not
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
        plan = self._plan(
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
            forward_samples=self._forward_size(size, capped=slice_size is None),
            columns=columns,
        )

    def columns(self, indices: torch.Tensor | Sequence[int]) -> ColumnSubset:
        """The subset of flat parameter ``indices`` (the order of ``replicas.names``),
        checked, for [`prepare`][marquardt.jacobian.JacobianEngine.prepare]."""
        return ColumnSubset.of(indices, self.replicas[0].sizes)

    def _probe(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
        """``(m, activations per sample)`` from a forward pass on the first samples."""
        if isinstance(self.residual_fn, PointResidual):
            m, self._activations = probe_points(self.replicas[0], self.residual_fn, inputs, targets)
            self._graph = self._input_graph(inputs)
            return m, self._activations
        m, self._activations = probe(self.replicas[0], self.residual_fn, inputs, targets)
        return m, self._activations

    def rows_per_sample(self, inputs: torch.Tensor, targets: torch.Tensor) -> int:
        """``m``: residual rows per sample (checks the batch and residual_fn first)."""
        check_batch(inputs, targets)
        check_batchnorm(self.replicas.model)
        return self._probe(inputs, targets)[0]

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

    def _input_graph(self, inputs: torch.Tensor) -> int:
        """How many times a sample's activations its input-derivative graph takes (1 for
        residuals of the outputs)."""
        if isinstance(self.residual_fn, PointResidual):
            return self.residual_fn.graph_factor(int(inputs[0].numel()))
        return 1

    def _budget(self) -> int:
        return self.memory_budget or default_budget(self.replicas.devices[0])

    def _forward_size(self, size: int, *, capped: bool) -> int:
        """Samples per forward-only slice: ``size``, or without a ``slice_size`` (``capped``)
        at most what the budget holds for the activations of the last probe."""
        if not capped:
            return size
        activations = (self._activations or 1) * self._graph
        fits = forward_samples(self._budget(), activations, self.replicas.dtype)
        if self.last_plan is not None and self.last_plan.mode == "broadcast":
            fits = min(fits, BROADCAST_CHUNK)  # element-wise work: chunks that stay in cache
        return min(size, fits)

    def _plan(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        batch: int,
        size: int,
        strategy: str,
        *,
        cap: bool = False,
        params: int | None = None,
    ) -> JacobianPlan:
        settings = (batch, size, strategy, cap, params, self.memory_budget, self.residual_fn)
        known = self._memo.get(inputs, targets, settings)
        if known is not None:
            self.last_plan = known
            return known
        m, activations = self._probe(inputs, targets)
        outputs_fn = None if isinstance(self.residual_fn, PointResidual) else self.residual_fn
        if outputs_fn and self.mode in ("auto", "layers") and self._layers_ok is None:
            # Checked once per engine: where the rules disagree, vmap is used instead.
            why = verify_layers(self.replicas[0], outputs_fn, inputs, targets)
            self._layers_ok = why is None
            if why is not None:
                self._layers_reason = why
        if outputs_fn and self.mode in ("auto", "broadcast") and self._broadcast_ok is None:
            why = verify_broadcast(self.replicas[0], outputs_fn, inputs, targets)
            self._broadcast_ok = why is None
            if why is not None:
                self._broadcast_reason = why
        plan = plan_jacobian(
            batch * m,
            self.replicas.num_params if params is None else params,
            m,
            self.replicas.dtype,
            self._budget(),
            strategy=strategy,
            mode=self.mode,
            layers_supported=bool(self._layers_ok),
            layers_reason=self._layers_reason,
            broadcast_supported=bool(self._broadcast_ok),
            broadcast_reason=self._broadcast_reason,
            activations_per_sample=activations,
            slice_samples=size,
            cap_slices=cap,
            input_graph=self._input_graph(inputs),
        )
        self.last_plan = plan
        self._memo.keep(inputs, targets, settings, plan)
        return plan

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
        if slice_size is None and self._activations is None:
            self._probe(inputs, targets)
        size = self._forward_size(size, capped=slice_size is None)
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
