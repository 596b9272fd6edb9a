"""How the engine plans a batch: one probe forward, the mode checks, one plan: `BatchPlanner`.

A step's batch is probed once (residual rows per sample ``m``, activations per sample),
the per-layer and broadcast rules are checked once per engine against ``vmap`` (where they
disagree, ``vmap`` is used instead), and ``plan_jacobian`` chooses the strategy, mode and
chunking from N, P, m, the dtype and the memory budget. The same batch, unchanged, is
probed and planned once (`PlanMemo`); forward-only slices are sized from the last probe.
"""

from __future__ import annotations

import torch

from ._forward import forward_samples
from ._modes import broadcast_support, layers_support
from ._modes._broadcast import BROADCAST_CHUNK
from ._plan_memo import PlanMemo
from ._planner import JacobianPlan, plan_jacobian
from ._points import AnyResidual, PointResidual
from ._probe import default_budget, probe, probe_points, verify_broadcast, verify_layers
from ._replicas import Replicas

__all__ = ["BatchPlanner"]


class BatchPlanner:
    """The plans of one engine's batches, and what its probes learnt of the model.

    Arguments:
        replicas: the engine's replicas (the probes run on the first).
        residual_fn: the residual the engine was built with (decides which modes apply).
        mode: the engine's Jacobian mode ("auto" or a forced one).
        memory_budget: bytes of one chunk on one device (None: the device's default).
    """

    def __init__(
        self,
        replicas: Replicas,
        residual_fn: AnyResidual,
        mode: str,
        memory_budget: int | None,
    ) -> None:
        self.replicas = replicas
        self.mode = mode
        self.memory_budget = memory_budget
        self.last_plan: JacobianPlan | None = None
        self._memo = PlanMemo()  # the same batch, unchanged, is probed and planned once
        # Activations per sample from the last probe: sizes forward-only slices.
        self.activations: int | None = None
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

    def probe(
        self, residual_fn: AnyResidual, inputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[int, int]:
        """``(m, activations per sample)`` from a forward pass on the first samples."""
        if isinstance(residual_fn, PointResidual):
            m, self.activations = probe_points(self.replicas[0], residual_fn, inputs, targets)
            self._graph = input_graph(residual_fn, inputs)
            return m, self.activations
        m, self.activations = probe(self.replicas[0], residual_fn, inputs, targets)
        return m, self.activations

    def budget(self) -> int:
        """Bytes of one chunk on one device."""
        return self.memory_budget or default_budget(self.replicas.devices[0])

    def forward_size(self, size: int, *, capped: bool) -> int:
        """Samples per forward-only slice: ``size``, or without a ``slice_size`` (``capped``)
        at most what the budget holds for the activations of the last probe."""
        if not capped:
            return size
        activations = (self.activations or 1) * self._graph
        fits = forward_samples(self.budget(), activations, self.replicas.dtype)
        if self.last_plan is not None and self.last_plan.mode == "broadcast":
            fits = min(fits, BROADCAST_CHUNK)  # element-wise work: chunks that stay in cache
        return min(size, fits)

    def plan(
        self,
        residual_fn: AnyResidual,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        batch: int,
        size: int,
        strategy: str,
        *,
        cap: bool = False,
        params: int | None = None,
    ) -> JacobianPlan:
        """The plan of a checked batch of ``batch`` samples in slices of ``size`` (kept in
        ``last_plan``); ``params``: the columns of a subset (None: every parameter)."""
        settings = (batch, size, strategy, cap, params, self.memory_budget, residual_fn)
        known = self._memo.get(inputs, targets, settings)
        if known is not None:
            self.last_plan = known
            return known
        m, activations = self.probe(residual_fn, inputs, targets)
        outputs_fn = None if isinstance(residual_fn, PointResidual) else residual_fn
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
            self.budget(),
            strategy=strategy,
            mode=self.mode,
            layers_supported=bool(self._layers_ok),
            layers_reason=self._layers_reason,
            broadcast_supported=bool(self._broadcast_ok),
            broadcast_reason=self._broadcast_reason,
            activations_per_sample=activations,
            slice_samples=size,
            cap_slices=cap,
            input_graph=input_graph(residual_fn, inputs),
        )
        self.last_plan = plan
        self._memo.keep(inputs, targets, settings, plan)
        return plan


def input_graph(residual_fn: AnyResidual, inputs: torch.Tensor) -> int:
    """How many times a sample's activations its input-derivative graph takes (1 for
    residuals of the outputs)."""
    if isinstance(residual_fn, PointResidual):
        return residual_fn.graph_factor(int(inputs[0].numel()))
    return 1
