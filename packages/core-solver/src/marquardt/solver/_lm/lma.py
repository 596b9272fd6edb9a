"""The Levenberg-Marquardt algorithm for PyTorch models: `LMA`.

One step solves the damped normal equations (JᵀJ/N + λD)δ = Jᵀr/N, or for N < P
(JJᵀ/N + λI)u = r/N with δ = Jᵀu, and tries θ ← θ − lr·δ; a rejected attempt raises λ and
solves the same assembled system again (Levenberg 1944; Marquardt 1963; Nielsen 1999;
Moré 1978). The mathematics, and what every keyword does, are in docs/algorithm.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from marquardt.devices import check_model_devices
from marquardt.jacobian import (
    JacobianEngine,
    PreparedBatch,
    Replicas,
    ResidualNotFiniteError,
)

from .._backends.base import ArrayBackend
from .._backends.choice import resolve_backend
from .._errors import BatchNotFiniteError
from .assembly import SystemRequest
from .attempt.paths import AttemptPaths
from .attempt.step import StepInput, StepTools, damped_step
from .batch import FiniteScans, check_batch
from .covariance import batch_covariance
from .damping.base import DampingRule
from .options import (
    STRATEGIES,
    LossFn,
    ResidualFn,
    check_resolved_backend,
    lma_options,
)
from .report import StepReport
from .scope import StepScope, step_scope
from .solve.cg import ConjugateGradients
from .solve.cg_options import TruncatedCG
from .state import restored, solver_state
from .step_fit import StepLimits, fit_step
from .stopping import StopFacts
from .stopping.criteria import StoppingCriteria
from .subsets import ParamSelection, Selector

__all__ = ["LMA", "STRATEGIES"]

#: ``LMA.__init__``'s arguments that are not keywords of the options.
_POSITIONAL = frozenset({"self", "model", "devices", "residual_fn"})


class LMA:
    """Levenberg-Marquardt training of a PyTorch model, one damped Gauss-Newton step a call.

    Every keyword is checked before anything is built (`SolverConfigError`); the
    mathematics and each option at length: docs/algorithm.md.

    Arguments:
        model: the ``nn.Module`` whose trainable parameters θ are the unknowns; it must
            sit on one of ``devices``.
        devices: the model devices; the model is replicated on each for data-parallel
            Jacobians. CUDA devices that Legate holds are refused.
        residual_fn: ``residual_fn(outputs, targets)`` -> residuals (e.g. ``a - b``), or a
            ``marquardt.jacobian.PointResidual`` (residuals differentiating the model by
            its inputs; physics-informed networks).
        loss_fn: ``loss_fn(outputs, targets)``, deciding acceptance instead of the mean of
            squared residuals ‖r‖²/N.
        learning_rate: lr of θ ← θ − lr·δ.
        damping: "nielsen" (Nielsen's gain-ratio rule), "fixed" (λ·up on rejection,
            λ·down on acceptance) or a ``DampingRule``.
        damping_start: the first λ of the named rules.
        damping_up: the fixed rule's factor on rejection (> 1).
        damping_down: the fixed rule's factor on acceptance (< 1).
        damping_min: λ's floor.
        damping_max: λ's ceiling; reaching it terminates.
        scaling: D = diag(JᵀJ)/N clamped ("marquardt") or D = I ("identity").
        attempts: the damped solves a step may take.
        strategy: "auto" (the planner), "accumulate" (JᵀJ summed on the model devices),
            "explicit" (J assembled; the under-determined form) or "matrix_free"
            (conjugate gradients on products JᵀJv, no matrix formed).
        backend: "auto", "cupynumeric", "torch", "numpy" or an ``ArrayBackend``.
        dtype: the dtype the normal products are accumulated in (None: the parameters');
            factorisations are float64 always.
        ftol: MINPACK's relative reduction test (None: off).
        xtol: MINPACK's relative step test (None: off).
        gtol: MINPACK's gradient orthogonality test (None: off).
        jacobian_mode: handed to the ``JacobianEngine``.
        robust_loss: "soft_l1", "huber", "cauchy", "arctan" or "linear" (SciPy's ρ, by IRLS
            rows); None: least squares.
        f_scale: the robust loss's scale c.
        params_per_step: k, to step on k parameters at a time (None: all of them).
        param_selection: how the k are chosen: "layer", "random" or a function
            (step, P) -> indices.
        seed: the random selection's seed (in a process group, rank 0's).
        memory_limit: the bytes a step may use (None: 0.8 × the free memory).
        process_group: None (one process), "default" (torch.distributed's world group) or
            a ``ProcessGroup``: every step is then a step of the global batch, the ranks'
            shares stacked in rank order; building the LMA broadcasts rank 0's θ.
        geodesic: α of Transtrum's geodesic acceleration (None: off).
        geodesic_reject: reject the attempt where 2‖a‖/‖v‖ > α, instead of dropping a.
        geodesic_after: the step the acceleration starts at.
        scaling_memory: γ ∈ [0, 1] of D_k = max(diag_k, γ·D_{k−1}) (1: MINPACK's running
            maximum).
        cg: the matrix-free step's ``TruncatedCG`` (budget, tolerance, warm start, probes).
        compile_attempt: "auto" (the planner), "on" or "off": each damped attempt as one
            tensor function, compiled on CPUs (``torch.compile``) and captured as a CUDA
            graph on GPUs, or the eager attempts; models it cannot trace run eagerly, and
            ``report.attempt_path`` / ``attempt_reason`` say which ran and why.
        stopping: further stopping tests' options by name (``ftol``, ``xtol``, ``gtol``
            or a registered test's), or a ``StoppingCriteria``; a test that holds ends the
            run with its name as ``report.termination``.
        linear_solver: the damped solve: "auto" (by the step's strategy: the backend's
            Cholesky for dense systems, conjugate gradients for matrix-free ones) or a
            registered solver's name.

    Raises:
        SolverConfigError: an argument is out of range, of the wrong kind, or cannot be
            combined with another.
        marquardt.devices.DeviceError: a CUDA device of ``devices`` is held by Legate.
    """

    def __init__(
        self,
        model: nn.Module,
        devices: Sequence[torch.device | str],
        residual_fn: ResidualFn,
        *,
        loss_fn: LossFn | None = None,
        learning_rate: float = 1.0,
        damping: str | DampingRule = "nielsen",
        damping_start: float = 1e-3,
        damping_up: float = 10.0,
        damping_down: float = 0.1,
        damping_min: float = 1e-10,
        damping_max: float = 1e10,
        scaling: str = "marquardt",
        attempts: int = 10,
        strategy: str = "auto",
        backend: str | ArrayBackend = "auto",
        dtype: torch.dtype | None = None,
        ftol: float | None = None,
        xtol: float | None = None,
        gtol: float | None = None,
        jacobian_mode: str = "auto",
        robust_loss: str | None = None,
        f_scale: float = 1.0,
        params_per_step: int | None = None,
        param_selection: str | Selector = "random",
        seed: int | None = None,
        memory_limit: int | None = None,
        process_group: torch.distributed.ProcessGroup | str | None = None,
        geodesic: float | None = None,
        geodesic_reject: bool = False,
        geodesic_after: int = 0,
        scaling_memory: float = 0.0,
        cg: TruncatedCG | None = None,
        compile_attempt: str = "auto",
        stopping: Mapping[str, object] | StoppingCriteria | None = None,
        linear_solver: str = "auto",
    ) -> None:
        # The keywords are declared once, above; every one is checked before anything
        # is built or the model is touched.
        given = {k: v for k, v in locals().items() if k not in _POSITIONAL}
        options = lma_options(model, devices, residual_fn, given)
        if any(str(d).startswith("cuda") for d in options.devices):
            # A model GPU that Legate also holds would be shared by two allocators (Legate
            # reserves 95% of its GPUs' memory): refuse before anything is built.
            check_model_devices(options.devices)
        self._options = options
        devices_ = [torch.device(d) for d in options.devices]
        self._scope: StepScope = step_scope(options.process_group, devices_)
        self._replicas = Replicas(model, options.devices)
        self._scope.sync_parameters(self._replicas)
        # Random subsets must select the same columns on every rank of a group.
        self._seed = self._scope.common_seed(options.seed)
        self._engine = JacobianEngine(self._replicas, options.residual_fn, mode=jacobian_mode)
        self._backend = resolve_backend(options.backend, self._replicas.devices[0])
        # "auto" may have chosen cuPyNumeric: the same refusal as for naming it.
        check_resolved_backend(options.acceleration, self._backend)
        self._rule = options.rule  # holds λ, which carries over from step to step
        self._strategy = options.strategy  # the planner may switch it
        self._strategy_reason = ""  # why the planner left the dense strategies, when it did
        self._cg_solver = ConjugateGradients(options.cg, seed=self._seed)
        self._attempt_paths = AttemptPaths(
            options.compile_attempt, world_size=self._scope.world_size
        )
        self._diag: Any = None  # the remembered D of the last step (scaling_memory)
        self._steps = 0
        self._started: float | None = None  # when the first step began (the "step" tests)
        self._scans = FiniteScans()  # the same batch, unchanged, is scanned once
        self.report: StepReport | None = None
        self._selection = options.selection(self._replicas[0].sizes, self._seed)

    # -- properties ----------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The model being trained (its parameters are the unknowns)."""
        return self._replicas.model

    @property
    def devices(self) -> list[torch.device]:
        """The model devices (one replica each)."""
        return self._replicas.devices

    @property
    def backend(self) -> ArrayBackend:
        """The array backend assembling and solving the normal equations."""
        return self._backend

    @property
    def damping(self) -> float:
        """λ, the value the next step starts from."""
        return self._rule.damping

    @property
    def damping_rule(self) -> DampingRule:
        """The damping rule object (holds λ)."""
        return self._rule

    @property
    def learning_rate(self) -> float:
        """The factor applied to every step δ."""
        return self._options.learning_rate

    @property
    def world_size(self) -> int:
        """How many ranks share each step (1 without a ``process_group``)."""
        return self._scope.world_size

    @property
    def steps(self) -> int:
        """How many steps have been taken (accepted or not)."""
        return self._steps

    def sync_replicas(self) -> None:
        """Copy the model's parameters and buffers to the replicas on the other devices.

        The trainable parameters of ``lma.model`` are views of its replica's flat vector,
        so writing into them (``model.load_state_dict`` after a resume, a manual change) is
        seen by that replica only; call this afterwards so every device computes with the
        same θ. Steps keep the replicas in sync by themselves.
        """
        self._replicas.sync_from_model()

    # -- the step ------------------------------------------------------------------------
    def _trial_loss(self, batch: PreparedBatch) -> torch.Tensor:
        """The loss at the current parameters on the step's prepared batch, as a 0-dim
        tensor on the model device (not read back here); non-finite when the forward is."""
        with torch.no_grad():
            loss = self._engine.batch_loss(batch, self._options.loss_fn)
        return self._scope.mean_loss(loss, batch, custom=self._options.loss_fn is not None)

    def step(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None = None
    ) -> tuple[float, bool]:
        """One LM step on the batch (inputs, targets); returns (loss, terminated).

        ``loss`` is the loss on this batch at the parameters the model holds after the
        step (the accepted point, or the start when nothing was accepted). ``slice_size``
        is how many samples each Jacobian slice holds (None: the whole batch in one).
        With a ``process_group`` (see the class docstring), (inputs, targets) is this
        rank's share of the global batch, ``slice_size`` applies to it, and ``loss`` is
        the loss on the global batch, the same on every rank.
        """
        try:
            inputs, targets, slice_size = check_batch(
                inputs,
                targets,
                slice_size,
                dtype=self._replicas.dtype,
                home=self._replicas.devices,
                scans=self._scans,
            )
        except BatchNotFiniteError:
            self._scope.refuse(self._strategy)  # the other ranks refuse it too
            raise
        grad = torch.is_grad_enabled()
        try:
            if self._selection is None:
                return self._step(inputs, targets, slice_size, None)
            with self._selection.drawn(self._steps) as index:
                return self._step(inputs, targets, slice_size, index)
        finally:
            # A Ctrl-C landing inside torch.no_grad()'s own __enter__ or __exit__ leaves
            # grad mode off in this thread, and every later step without a graph.
            torch.set_grad_enabled(grad)

    def _step(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None,
        index: torch.Tensor | None,
    ) -> tuple[float, bool]:
        t_begin = time.perf_counter()
        columns = None if index is None else self._engine.columns(index)
        # Checked above (NaN/inf included); planned once here, and reused by the assembly
        # and every trial forward of this step.
        try:
            batch = self._scope.prepare(
                self._engine, inputs, targets, slice_size, self._strategy, columns=columns
            )
        except ResidualNotFiniteError:
            # Planning evaluates residuals: the other ranks learn of the refusal through
            # the plan's collective, and refuse the batch too.
            self._scope.refuse(self._strategy)
            raise
        limits = StepLimits(
            self._backend.name,
            self._options.memory_limit,
            self._options.cg.probes,
            self._options.cg.rank,
            self._options.auto_subsets,
        )
        refit = fit_step(batch, slice_size, scope=self._scope, engine=self._engine, limits=limits)
        if refit is not None:
            # Too large for the memory, chosen by the planner: matrix-free steps (or, where
            # those do not fit either, subsets) from now on.
            self._strategy = refit.strategy
            self._strategy_reason = refit.reason or self._strategy_reason
            if refit.subsets is not None:
                sizes = self._replicas[0].sizes
                self._selection = ParamSelection(refit.subsets, "random", sizes, self._seed)
            return self.step(inputs, targets, slice_size)
        request = SystemRequest(
            self._options.dtype, batch.params, probes=self._options.cg.probes, seed=self._steps
        )
        built = self._scope.assemble(self._engine, self._backend, batch, request)
        given = StepInput(
            built,
            batch,
            columns,
            trial_loss=lambda: self._trial_loss(batch),
            diag=self._diag,
            step=self._steps,
            strategy_reason=self._strategy_reason,
        )
        tools = StepTools(
            self._options,
            self._rule,
            self._backend,
            self._cg_solver,
            self._engine,
            self._attempt_paths,
        )
        report, loss, terminated, self._diag = damped_step(tools, given)
        return self._finish(report, t_begin, loss, terminated=terminated)

    def _finish(
        self, report: StepReport, t_begin: float, loss: float, *, terminated: bool
    ) -> tuple[float, bool]:
        if self._started is None:
            self._started = t_begin
        if not terminated and self._options.stopping.asks("step"):
            elapsed = time.perf_counter() - self._started
            facts = StopFacts(
                loss_before=report.loss_before, seconds=elapsed, steps=self._steps + 1
            )
            terminated = self._options.stopping.stop("step", facts, report)
        report.terminated = terminated
        report.damping = self._rule.damping
        report.seconds_total = time.perf_counter() - t_begin
        self._scope.finish(report, self._replicas)
        self.report = report
        self._steps += 1
        return float(loss), bool(terminated)

    # -- uncertainties -------------------------------------------------------------------
    def covariance(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None = None,
        *,
        absolute_sigma: bool = False,
    ) -> torch.Tensor:
        """pcov = s²·(JᵀJ)⁻¹ at the current parameters (the last accepted point) on a batch.

        J is the Jacobian of ``residual_fn`` on (inputs, targets), with the parameters in
        ``model.parameters()`` order; s² = ‖r‖²/(N − P) unless ``absolute_sigma`` (s² = 1,
        residuals already divided by known σ). Computed from the QR factor of J, slice by
        slice, as ``curve_fit`` does: a P × P float64 tensor on the CPU,
        all inf (with a ``CovarianceWarning``) when J has rank < P or N ≤ P. For models
        whose P × P matrix fits in memory.
        """
        self._options.check_covariance()
        return batch_covariance(
            self._engine, inputs, targets, slice_size, absolute_sigma=absolute_sigma
        ).pcov

    def standard_errors(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        slice_size: int | None = None,
        *,
        absolute_sigma: bool = False,
    ) -> torch.Tensor:
        """√diag(pcov) of [`covariance`][marquardt.solver.LMA.covariance]: one standard error per parameter."""
        pcov = self.covariance(inputs, targets, slice_size, absolute_sigma=absolute_sigma)
        return torch.sqrt(torch.diagonal(pcov))

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The solver's state: the damping rule's state (λ, ν), step count, settings.

        The model's parameters are not included (save ``lma.model.state_dict()``). With
        ``params_per_step``, ``"param_selection"`` holds the selection's state (the layer
        cursor, the random generator), so a resumed run selects what it would have; after a
        matrix-free step, ``"matrix_free"`` the CG warm start and random generator.
        """
        return solver_state(
            self._rule,
            self._steps,
            self._options.learning_rate,
            self._options.scaling.name,
            self._selection,
            self._cg_solver.state_dict() if self._cg_solver.used else None,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; checks everything before changing anything."""
        self._selection, damping_state, self._steps, cg_state = restored(
            state,
            self._rule,
            self._selection,
            resumable=self._options.auto_subsets,
            sizes=self._replicas[0].sizes,
            seed=self._seed,
        )
        self._rule.load_state_dict(damping_state)
        if cg_state is not None:
            self._cg_solver.load_state_dict(cg_state)
