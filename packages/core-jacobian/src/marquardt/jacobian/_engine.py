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
from torch import nn

from . import _settings
from ._errors import ResidualDetachedError, UnknownModeError, message
from ._gram import GramAccumulator
from ._host_heap import keep_host_heap
from ._modes import ResidualFn, jacfwd_jacobian, layers_jacobian, layers_support, vmap_jacobian
from ._modes._common import rows_of
from ._modes._reference import reference_jacobian
from ._planner import MODES, JacobianPlan, plan_jacobian
from ._products import JacobianSlice, NormalProducts
from ._replicas import Replicas
from ._slicing import DeviceWorkers, slice_ranges, to_device, to_host_fresh
from ._validate import check_batch, check_batchnorm, check_finite_residuals, check_slice_size

__all__ = ["JacobianEngine"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_PROBE = 4


def _default_budget(device: torch.device) -> int:
    forced = _settings.memory_budget()
    if forced is not None:
        return forced
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return max(1 << 26, free // 2)
    return _settings.DEFAULT_CPU_BUDGET


class JacobianEngine:
    """Computes ``r`` and ``J = ∂r/∂θ`` (or ``JᵀJ``, ``Jᵀr``) on every replica's device.

    ``mode`` is ``"auto"``, ``"vmap"``, ``"jacfwd"`` or ``"layers"``; ``memory_budget``
    bounds the intermediate bytes of one chunk on one device (default from
    ``MARQUARDT_JACOBIAN_MEMORY_BUDGET``, else 256 MiB on CPU, half the free GPU memory).
    Without a ``slice_size`` the budget also caps ``accumulate`` slices (one chunk each)
    and forward-only slices (loss, residuals), so memory does not grow with the batch.
    ``output_device`` is where explicit slices and residuals are handed out
    (default ``devices[0]``). After each call, ``last_plan`` says what was chosen and
    why, and ``timings`` how many seconds went where.
    """

    def __init__(
        self,
        replicas: Replicas,
        residual_fn: ResidualFn,
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
        if not callable(residual_fn):
            raise TypeError(
                message(
                    "residual_fn was expected as a function (output, target) -> residuals",
                    f"got {type(residual_fn).__name__}",
                    "pass e.g. lambda a, b: a - b",
                )
            )
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
        self.timings: dict[str, float] = {}
        self._workers = DeviceWorkers(replicas.devices)
        # Per-device buffers for the layers-mode J of one accumulate chunk, kept from call
        # to call: a fresh chunk-sized buffer every step costs its page faults every step.
        self._workspaces: dict[int, torch.Tensor] = {}
        # Activations per sample from the last probe: sizes forward-only slices.
        self._activations: int | None = None
        supported, why = layers_support(replicas.model)
        self._layers_ok: bool | None = None if supported else False
        self._layers_reason = why
        if any(d.type == "cpu" for d in replicas.devices):
            keep_host_heap()  # each step's freed host blocks serve the next step

    # -- checks and planning -----------------------------------------------------------
    def _prepare(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None
    ) -> tuple[int, int]:
        batch = check_batch(inputs, targets)
        size = check_slice_size(slice_size, batch, len(self.replicas))
        check_batchnorm(self.replicas.model)
        return batch, size

    def _probe(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
        """``(m, activations per sample)`` from a forward pass on the first samples."""
        replica = self.replicas[0]
        k = min(_PROBE, int(inputs.shape[0]))
        x = to_device(inputs[:k], replica.device)
        y = to_device(targets[:k], replica.device)
        activations = 0

        def count(_m: nn.Module, _a: tuple[torch.Tensor, ...], out: object) -> None:
            nonlocal activations
            if isinstance(out, torch.Tensor):
                activations += out.numel()

        leaves = [m for m in replica.module.modules() if not list(m.children())]
        handles = [m.register_forward_hook(count) for m in leaves]
        try:
            with torch.enable_grad():
                res = rows_of(self.residual_fn(replica.module(x), y), k)
        finally:
            for h in handles:
                h.remove()
        if not res.requires_grad:
            raise ResidualDetachedError(
                message(
                    "the Jacobian of residual_fn(model(x), y) with respect to the parameters "
                    "was requested",
                    "the residuals do not depend on any trainable parameter (no autograd graph)",
                    "do not detach the model output or call .item()/.numpy() in residual_fn",
                )
            )
        check_finite_residuals(res.detach(), res.shape[1])
        self._activations = max(1, activations // k)
        return int(res.shape[1]), self._activations

    def rows_per_sample(self, inputs: torch.Tensor, targets: torch.Tensor) -> int:
        """``m``: residual rows per sample (checks the batch and residual_fn first)."""
        check_batch(inputs, targets)
        check_batchnorm(self.replicas.model)
        return self._probe(inputs, targets)[0]

    def _verify_layers(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Compare the layer rules with plain per-sample reverse mode on a few samples, once.

        The rules assume each trainable parameter acts only through its own layer's
        forward (no weight used outside it, no in-place change of a layer output);
        where that fails the comparison does, and the engine uses vmap instead.
        """
        replica = self.replicas[0]
        k = min(_PROBE, int(inputs.shape[0]))
        x = to_device(inputs[:k], replica.device)
        y = to_device(targets[:k], replica.device)
        j_rules, _ = layers_jacobian(replica, self.residual_fn, x, y)
        j_ref, _ = reference_jacobian(replica, self.residual_fn, x, y)
        scale = max(1.0, float(j_ref.abs().max()))
        tol = 1e3 * torch.finfo(j_ref.dtype).eps * scale
        diff = float((j_rules - j_ref).abs().max())
        if diff <= tol:
            self._layers_ok = True
        else:
            self._layers_ok = False
            self._layers_reason = (
                f"the layer rules disagree with per-sample reverse mode by {diff:.3g} (> {tol:.3g}) on "
                "this model (a weight used outside its layer, or an in-place op on a layer output)"
            )

    def plan(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None = None,
        *,
        strategy: str = "auto",
    ) -> JacobianPlan:
        """Check the batch and choose strategy, mode and chunking (kept in ``last_plan``)."""
        batch, size = self._prepare(inputs, targets, slice_size)
        return self._plan(inputs, targets, batch, size, strategy, cap=slice_size is None)

    def _budget(self) -> int:
        return self.memory_budget or _default_budget(self.replicas.devices[0])

    def _plan(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        batch: int,
        size: int,
        strategy: str,
        *,
        cap: bool = False,
    ) -> JacobianPlan:
        m, activations = self._probe(inputs, targets)
        if self.mode in ("auto", "layers") and self._layers_ok is None:
            self._verify_layers(inputs, targets)
        budget = self._budget()
        plan = plan_jacobian(
            batch * m,
            self.replicas.num_params,
            m,
            self.replicas.dtype,
            budget,
            strategy=strategy,
            mode=self.mode,
            layers_supported=bool(self._layers_ok),
            layers_reason=self._layers_reason,
            activations_per_sample=activations,
            slice_samples=size,
            cap_slices=cap,
        )
        self.last_plan = plan
        return plan

    # -- the per-slice work ------------------------------------------------------------
    def _jacobian_chunks(
        self,
        index: int,
        x: torch.Tensor,
        y: torch.Tensor,
        plan: JacobianPlan,
        workspace: torch.Tensor | None = None,
        first_sample: int = 0,
        *,
        fill: bool = False,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(J, r)`` of successive chunks of at most ``plan.samples_per_chunk`` samples.

        With a ``workspace`` (``samples_per_chunk·m × P``, accumulate only: nothing from
        it is handed out) the layers mode writes each chunk's ``J`` there, so memory is
        reused from chunk to chunk instead of being allocated and faulted in anew. With
        ``fill`` the workspace holds the whole slice's ``J`` and chunk ``c`` lands in its
        own rows (explicit: one slice-sized ``J``, no concatenation of chunk copies).
        """
        replica = self.replicas[index]
        step = plan.samples_per_chunk
        m = plan.outputs_per_sample
        for lo in range(0, int(x.shape[0]), step):
            xs, ys = x[lo : lo + step], y[lo : lo + step]
            first = lo * m if fill else 0
            out = None if workspace is None else workspace[first : first + int(xs.shape[0]) * m]
            if plan.mode == "layers":
                jac, res = layers_jacobian(replica, self.residual_fn, xs, ys, out=out)
            elif plan.mode == "jacfwd":
                jac, res = jacfwd_jacobian(
                    replica,
                    self.residual_fn,
                    xs,
                    ys,
                    samples_per_call=step,
                    param_chunk=plan.param_chunk,
                )
            else:
                jac, res = vmap_jacobian(replica, self.residual_fn, xs, ys, samples_per_call=step)
            if fill and out is not None and plan.mode != "layers":
                jac = out.copy_(jac)
            check_finite_residuals(res, plan.outputs_per_sample, first_sample + lo)
            yield jac, res

    def _slice_jacobian(
        self,
        index: int,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        lo: int,
        hi: int,
        plan: JacobianPlan,
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        device = self.replicas[index].device
        x = to_device(inputs[lo:hi], device)
        y = to_device(targets[lo:hi], device)
        jac_all: torch.Tensor | None = None
        if hi - lo > plan.samples_per_chunk:
            # Several chunks: each writes its rows of one fresh slice-sized J.
            jac_all = torch.empty(
                (hi - lo) * plan.outputs_per_sample,
                self.replicas.num_params,
                dtype=self.replicas.dtype,
                device=device,
            )
        parts = list(self._jacobian_chunks(index, x, y, plan, jac_all, lo, fill=True))
        if jac_all is None:
            jac, res = parts[0]
        else:
            jac = jac_all
            res = torch.cat([p[1] for p in parts])
        start = time.perf_counter()
        jac = to_host_fresh(jac, self.output_device)
        res = to_host_fresh(res, self.output_device)
        return jac, res, time.perf_counter() - start

    # -- public products ---------------------------------------------------------------
    def slices(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None = None
    ) -> Iterator[JacobianSlice]:
        """Strategy ``explicit``: the slices of ``J`` and ``r`` in row order.

        Everything is checked (batch, slice size, residual shape, finiteness on the
        first samples) before the first slice is computed. Each slice's tensors are new
        and never written again by the engine.
        """
        batch, size = self._prepare(inputs, targets, slice_size)
        plan = self._plan(inputs, targets, batch, size, "explicit")
        m = plan.outputs_per_sample
        ranges = slice_ranges(batch, size)
        self.timings = {"jacobian": 0.0, "transfer": 0.0}
        jobs = [
            (lambda dev, lo=lo, hi=hi: self._slice_jacobian(dev, inputs, targets, lo, hi, plan))
            for lo, hi in ranges
        ]
        return self._yield_slices(jobs, ranges, m)

    def _yield_slices(
        self,
        jobs: Sequence[Callable[[int], tuple[torch.Tensor, torch.Tensor, float]]],
        ranges: list[tuple[int, int]],
        m: int,
    ) -> Iterator[JacobianSlice]:
        start = time.perf_counter()
        for (lo, hi), (jac, res, transfer) in zip(
            ranges, self._workers.map_ordered(jobs), strict=True
        ):
            self.timings["transfer"] += transfer
            self.timings["jacobian"] = time.perf_counter() - start
            yield JacobianSlice(start=lo * m, stop=hi * m, jacobian=jac, residuals=res)

    def jacobian(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole ``J`` (``R × P``) and ``r`` (``R``) on the output device."""
        parts = list(self.slices(inputs, targets, slice_size))
        if len(parts) == 1:
            return parts[0].jacobian, parts[0].residuals
        return torch.cat([p.jacobian for p in parts]), torch.cat([p.residuals for p in parts])

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
        batch, size = self._prepare(inputs, targets, slice_size)
        acc_dtype = dtype or self.replicas.dtype
        if not acc_dtype.is_floating_point:
            raise TypeError(
                message(
                    f"accumulation in {acc_dtype} was requested",
                    "it is not a floating dtype",
                    "pass torch.float32 or torch.float64, or None for the model dtype",
                )
            )
        plan = self._plan(inputs, targets, batch, size, "accumulate", cap=slice_size is None)
        size = plan.slice_samples or size
        params = self.replicas.num_params
        accumulators: dict[int, GramAccumulator] = {}
        workspaces: dict[int, torch.Tensor | None] = {}
        start = time.perf_counter()
        gram_seconds = [0.0] * len(self.replicas)

        def job(dev: int, lo: int, hi: int) -> None:
            replica = self.replicas[dev]
            if dev not in accumulators:
                accumulators[dev] = GramAccumulator(params, replica.device, acc_dtype)
                workspaces[dev] = (
                    self._workspace(
                        dev, min(plan.samples_per_chunk, hi - lo) * plan.outputs_per_sample
                    )
                    if plan.mode == "layers"
                    else None
                )
            acc = accumulators[dev]
            x = to_device(inputs[lo:hi], replica.device)
            y = to_device(targets[lo:hi], replica.device)
            for jac, res in self._jacobian_chunks(dev, x, y, plan, workspaces[dev], lo):
                t0 = time.perf_counter()
                acc.add(jac, res)
                gram_seconds[dev] += time.perf_counter() - t0

        jobs = [
            (lambda dev, lo=lo, hi=hi: job(dev, lo, hi)) for lo, hi in slice_ranges(batch, size)
        ]
        self._workers.run_all(jobs)
        t_reduce = time.perf_counter()
        home = self.replicas.devices[0]
        accs = [accumulators[i] for i in sorted(accumulators)]
        jtj = accs[0].finish().to(home)
        jtr = accs[0].jtr.to(home)
        rss = accs[0].rss.to(home)
        for a in accs[1:]:
            jtj = jtj + a.finish().to(home)
            jtr = jtr + a.jtr.to(home)
            rss = rss + a.rss.to(home)
        rows = sum(a.rows for a in accs)
        end = time.perf_counter()
        self.timings = {
            "jacobian": end - start,
            "gram": sum(gram_seconds),
            "reduce": end - t_reduce,
            "transfer": 0.0,
        }
        return NormalProducts(jtj=jtj, jtr=jtr, rss=float(rss), rows=rows)

    def _workspace(self, index: int, rows: int) -> torch.Tensor:
        """A ``rows × P`` buffer on replica ``index``'s device, reused across calls."""
        params = self.replicas.num_params
        dtype = self.replicas.dtype
        device = self.replicas[index].device
        held = self._workspaces.get(index)
        if held is None or held.dtype != dtype or held.device != device or held.shape[0] < rows:
            held = torch.empty(rows, params, dtype=dtype, device=device)
            self._workspaces[index] = held
        return held[:rows]

    def residuals(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None = None
    ) -> torch.Tensor:
        """All residual rows (``R``, sample-major) on the output device, without ``J``."""
        parts = self._forward_slices(inputs, targets, slice_size, None, keep_residuals=True)
        kept = [p[0] for p in parts if p[0] is not None]
        return torch.cat(kept) if len(kept) > 1 else kept[0]

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
        if loss_fn is None:
            return sum(float(p[1]) for p in parts) / sum(p[2] for p in parts)
        samples = sum(p[3] for p in parts)
        return sum(float(p[1]) * p[3] for p in parts) / samples

    def _forward_slices(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None,
        loss_fn: LossFn | None,
        *,
        keep_residuals: bool,
    ) -> list[tuple[torch.Tensor | None, float, int, int]]:
        """Per slice: (residuals if kept, loss sum or loss_fn value, rows, samples)."""
        batch, size = self._prepare(inputs, targets, slice_size)
        if slice_size is None:
            size = min(size, self._forward_samples(inputs, targets))

        def job(dev: int, lo: int, hi: int) -> tuple[torch.Tensor | None, float, int, int]:
            replica = self.replicas[dev]
            x = to_device(inputs[lo:hi], replica.device)
            y = to_device(targets[lo:hi], replica.device)
            with torch.no_grad():
                out = replica.module(x)
                res = rows_of(self.residual_fn(out, y), hi - lo)
                check_finite_residuals(res, res.shape[1], lo)
                value = res.pow(2).sum() if loss_fn is None else loss_fn(out, y)
            kept = to_host_fresh(res.reshape(-1), self.output_device) if keep_residuals else None
            return kept, float(value), int(res.numel()), hi - lo

        jobs = [
            (lambda dev, lo=lo, hi=hi: job(dev, lo, hi)) for lo, hi in slice_ranges(batch, size)
        ]
        return self._workers.run_all(jobs)

    def _forward_samples(self, inputs: torch.Tensor, targets: torch.Tensor) -> int:
        """Samples per forward-only slice within the budget (no graph: one sample costs at
        most the sum of its layer outputs, ``activations`` numbers)."""
        if self._activations is None:
            self._probe(inputs, targets)
        item = torch.empty((), dtype=self.replicas.dtype).element_size()
        return max(1, self._budget() // (item * (self._activations or 1)))

    def close(self) -> None:
        """Stop the device worker threads (they are also stopped at exit); free buffers."""
        self._workers.close()
        self._workspaces.clear()
