"""How the engine plans a batch: one probe forward, the mode checks, one plan: `BatchPlanner`.

A step's batch is probed once (residual rows per sample ``m``, activations per sample),
the modes of the table with a model check (the per-layer and broadcast rules) are checked
once per engine against plain reverse mode (where they disagree, the planner passes them
by), and ``plan_jacobian`` chooses the strategy, mode and
chunking from N, P, m, the dtype and the memory budget. The same batch, unchanged, is
probed and planned once (`PlanMemo`); forward-only slices are sized from the last probe.
"""

from __future__ import annotations

import torch

from ._forward import forward_samples
from ._machine_probe import machine_constants
from ._modes import MODE_TABLE, form_of
from ._modes._table import AUTO, FORMS
from ._plan_memo import PlanMemo
from ._planner import JacobianPlan, plan_jacobian
from ._points import AnyResidual, PointResidual
from ._probe import default_budget, probe, probe_points
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
        # By mode with a model check: passed (None: not yet verified on samples), and why.
        self._checks: dict[str, tuple[bool | None, str]] = {}
        form = form_of(residual_fn)
        for entry in MODE_TABLE.values():
            if entry.support is None:
                continue
            if not entry.serves(form):
                self._checks[entry.name] = (False, FORMS[form])
                continue
            ok, why = entry.support(replicas.model)
            # A rule that passes the model check is still verified on samples, if it has one.
            self._checks[entry.name] = (None if ok and entry.verify else ok, why)

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
        entry = MODE_TABLE.get(self.last_plan.mode) if self.last_plan is not None else None
        if entry is not None and entry.max_chunk is not None:
            fits = min(fits, entry.max_chunk)  # element-wise work: chunks that stay in cache
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
        self._verify(residual_fn, inputs, targets)
        plan = plan_jacobian(
            batch * m,
            self.replicas.num_params if params is None else params,
            m,
            self.replicas.dtype,
            self.budget(),
            strategy=strategy,
            mode=self.mode,
            support={name: (bool(ok), why) for name, (ok, why) in self._checks.items()},
            activations_per_sample=activations,
            slice_samples=size,
            cap_slices=cap,
            input_graph=input_graph(residual_fn, inputs),
            form=form_of(residual_fn),
            machine=machine_constants(self.replicas.devices[0], self.replicas.dtype)
            if strategy == "auto" and params is None
            else None,
        )
        self.last_plan = plan
        self._memo.keep(inputs, targets, settings, plan)
        return plan

    def _verify(
        self, residual_fn: AnyResidual, inputs: torch.Tensor, targets: torch.Tensor
    ) -> None:
        """Run, once per engine, the rule check of each mode the engine may use whose model
        check passed (where the rule disagrees, the planner passes the mode by)."""
        for name, (ok, _why) in self._checks.items():
            verify = MODE_TABLE[name].verify
            if ok is None and verify is not None and self.mode in (AUTO, name):
                why = verify(self.replicas[0], residual_fn, inputs, targets)
                self._checks[name] = (why is None, _why if why is None else why)


def input_graph(residual_fn: AnyResidual, inputs: torch.Tensor) -> int:
    """How many times a sample's activations its input-derivative graph takes (1 for
    residuals of the outputs)."""
    if isinstance(residual_fn, PointResidual):
        return residual_fn.graph_factor(int(inputs[0].numel()))
    return 1
