"""The Levenberg-Marquardt algorithm for PyTorch models: `LMA`.

For residuals r(θ) ∈ ℝᴺ of a model with parameters θ ∈ ℝᴾ on one batch and their
Jacobian J = ∂r/∂θ, one step (Levenberg 1944; Marquardt 1963; Nielsen 1999; Gavin's LM
notes) solves the damped normal equations

* over-determined (N ≥ P):  (JᵀJ/N + λD) δ = Jᵀr/N,
* under-determined (N < P): (JJᵀ/N + λI) u = r/N,  δ = Jᵀu,

and tries θ ← θ − lr·δ. The attempt is accepted when the damping rule says so (the loss
decreases; with Nielsen's rule, the gain ratio ρ = actual / predicted reduction is
positive); otherwise θ is restored and λ raised, and the *same* assembled system is solved
again with the new λ — the Jacobian is never recomputed within a step. A failed Cholesky
factorisation, a non-finite δ and a non-finite trial loss are rejected attempts, never
errors. After the step θ is always the last accepted point. ``terminated`` is true when
λ reaches its ceiling (no damping makes progress) or when a MINPACK-style ftol / xtol /
gtol test holds (only those that are set); ``LMA.report`` says which and why.

N is the number of residual rows; the default loss is the mean of squared residuals
‖r‖²/N, so the quadratic model's predicted reduction is 2·lr·δᵀg − lr²·δᵀAδ (see
``_backends.base``). With a custom ``loss_fn`` the acceptance test uses it, and the
prediction is rescaled by loss/MSE at the start of the step (exact when ``loss_fn`` is a
positive multiple of the mean squared residual, e.g. a sum or ½·mean).

λ lives in the damping rule and carries over from step to step, which is what makes the
loop correct for batches that change every step.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from marquardt.devices import check_model_devices
from marquardt.jacobian import (
    JacobianEngine,
    PointResidual,
    PreparedBatch,
    Replicas,
    ResidualNotFiniteError,
)

from .._backends.base import ArrayBackend, host_vector
from .._backends.choice import resolve_backend
from .._errors import BatchNotFiniteError, SolverConfigError, message
from .attempts import Attempts, run_attempts
from .batch import FiniteScans, check_batch
from .covariance import batch_covariance
from .damping import DampingRule
from .geodesic import GeodesicAcceleration
from .group import REFUSED, refused_elsewhere
from .matrix_free import ConjugateGradients, TruncatedCG
from .memory_fit import StepMemory, check_limit, step_memory, usable_memory
from .options import (
    DAMPING_RULES,
    STRATEGIES,
    LossFn,
    ResidualFn,
    check_matrix_free_options,
    check_options,
    check_poor_start_options,
)
from .points import check_point_residual
from .report import StepReport
from .robust import check_robust_loss, robust_residual_fn
from .scaling import remembered
from .scope import StepScope, step_scope
from .state import checked_state, solver_state
from .subsets import ParamSelection, Selector, SubsetBackend, check_selection

__all__ = ["DAMPING_RULES", "LMA", "STRATEGIES"]


class LMA:
    """Levenberg-Marquardt training of ``model`` (the maths: the docs' algorithm page).

    ``model`` must sit on one of ``devices`` (it is replicated on each for data-parallel
    Jacobians). ``residual_fn(outputs, targets)`` gives the residuals (e.g. ``a - b``), or it
    is a ``marquardt.jacobian.PointResidual``: residuals that call the model as a function
    of one point and differentiate it by its inputs (physics-informed networks; batches
    from ``PointResidual.batch``; see ``_lm/points.py`` and docs/tutorial/pinn.md).
    ``loss_fn(outputs, targets)``, when given, decides acceptance instead of the mean of
    squared residuals. ``learning_rate`` scales every step (θ ← θ − lr·δ). ``damping`` is
    "nielsen" (the default: Nielsen's gain-ratio rule) or "fixed" (λ·up on rejection,
    λ·down on acceptance), or any ``DampingRule``; λ starts at ``damping_start`` and stays
    in [damping_min, damping_max]. ``scaling`` is "marquardt" (the default: D =
    diag(JᵀJ)/N, clamped) or "identity" (D = I); ``scaling_memory`` γ ∈ [0, 1] makes
    Marquardt's D_k = max(diag_k, γ·D_{k−1}) (0, the default: this step's alone; 1:
    MINPACK's running maximum; it restarts after ``load_state_dict``).
    ``geodesic=α`` adds Transtrum's geodesic acceleration to every attempt, dropped where
    2‖a‖/‖v‖ > α, or with ``geodesic_reject=True`` rejecting the attempt there as
    Transtrum & Sethna (2012) do; ``geodesic_after=k`` applies it from the k-th step on
    (one more forward, Jacobian pass and solve per attempt; not with
    ``process_group``, ``params_per_step`` or the cuPyNumeric backend; ``curve_fit``'s
    choice is measured in docs/algorithm.md, "Poor starts"). The defaults are the
    measured best on the seed's sinc loop (fewer rejected attempts per step, lower loss
    per step). At most ``attempts`` damped solves per step. ``strategy``: "accumulate" (JᵀJ, Jᵀr summed on
    the model devices), "explicit" (J assembled by the backend; needed for the
    under-determined form), "matrix_free" (no matrix: (JᵀJ/N + λD)δ = Jᵀr/N by truncated
    preconditioned conjugate gradients on products JᵀJv from jvp/vjp, with D and the
    preconditioner from a Hutchinson estimate of diag(JᵀJ); ``cg`` is a ``TruncatedCG``
    of its budget, tolerance, warm start and probes; CG iterations per attempt in
    ``report.cg_iterations``; not with ``params_per_step`` or ``geodesic``; the warm start
    is not part of ``state_dict``) or "auto" (the Jacobian planner: accumulate when
    N ≥ P, explicit when N < P, matrix_free when neither system fits the memory, with a
    ``UserWarning`` and ``report.strategy_reason`` saying why).
    ``backend``: "auto", "cupynumeric", "torch", "numpy" or an ``ArrayBackend``. ``dtype``
    is the dtype the normal products are accumulated in (None: the parameters' dtype);
    factorisations are float64 always. ``ftol`` / ``xtol`` / ``gtol``: MINPACK-style
    stopping tests, off unless set. ``jacobian_mode`` is handed to the Jacobian engine.
    ``robust_loss`` ("soft_l1", "huber", "cauchy", "arctan", "linear"; None: least squares)
    with ``f_scale`` minimises the mean of c²ρ((r/c)²) over the residuals instead, with
    SciPy's ρ, by IRLS rows; the reported loss is that mean.
    ``params_per_step=k`` makes every step a block step on k parameters only (their k
    Jacobian columns alone are formed and a k × k, or N × N, system is solved), chosen by
    ``param_selection`` ("layer", "random" with ``seed``, or a function (step, P) ->
    indices). Before any Jacobian is formed a step checks that it fits
    ``memory_limit`` bytes (None: 0.8 × the free memory of the solver's device); with
    ``strategy="auto"`` and no ``params_per_step`` a step that would not fit switches to
    the matrix-free strategy, or where even that does not fit to random subsets of the
    largest k that does (a ``UserWarning`` says so), and a forced strategy or k that does
    not fit is refused before any work.

    ``process_group``: None (the default) is one process, even inside a script that has
    initialised torch.distributed (a DDP script fitting a model per rank, or curve fits on
    every rank, must not start exchanging matrices it never asked for). ``"default"``
    (torch.distributed's world group, initialised beforehand) or a
    ``torch.distributed.ProcessGroup`` makes every step one step of the *global* batch:
    each rank passes its own share of it to ``step`` (its local (inputs, targets), at least
    one sample; the global batch is the ranks' shares stacked in rank order), computes
    the Jacobian products of that share on its own ``devices``, and the ranks combine them
    with torch.distributed collectives (gloo for CPU models, NCCL for GPU models):
    strategy "accumulate" all-reduces JᵀJ, Jᵀr, ‖r‖² and N (P² + P + 2 numbers a step);
    "explicit" all-gathers the row blocks of J (N × P numbers a step: sensible while
    N ≲ 20,000 and N × P fits in one rank's memory); "auto" chooses from the *global* N.
    Every rank solves the same system, the trial loss of each attempt is all-reduced
    (Σ‖rₖ‖² / ΣNₖ, or for a ``loss_fn`` the samples-weighted mean, as one process weighs
    its slices), so every rank takes the same decision and λ stays identical; the
    returned loss and ``report`` are global (``report.rows`` is N; ``report.
    seconds_collective`` the time in collectives). θ of the group's rank 0 is broadcast
    to every rank when the LMA is built (as DDP does), so this is a collective call too.
    ``robust_loss``, ``loss_fn``, ``ftol`` / ``xtol`` / ``gtol`` and every damping rule
    work unchanged (their inputs are the global ones). ``covariance`` is not collective:
    it uses the batch it is given on this rank only. Every rank must call ``step`` the
    same number of times; a rank that dies or raises makes the others' next collective
    fail with ``RankFailureError`` (naming the rank that saw it and those that did not
    answer a roll call), within the group's ``timeout``. ``MARQUARDT_SOLVER_CHECK_RANKS=1``
    checks after every step that the ranks agree (``RanksDisagreeError`` otherwise).
    With ``params_per_step`` every rank selects the same columns: random subsets draw from
    rank 0's ``seed`` (one drawn there when none is given, broadcast when the LMA is
    built), and the memory check takes the plan the tightest rank can take.

    CUDA ``devices`` that Legate holds are refused (``marquardt.devices.DeviceError``)
    before anything is built; so are models with no trainable parameter or on a device not
    in ``devices`` (``marquardt.jacobian`` errors).
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
    ) -> None:
        # Every argument is checked before anything is built or the model is touched.
        options = check_options(
            model,
            devices,
            residual_fn,
            loss_fn=loss_fn,
            learning_rate=learning_rate,
            damping=damping,
            damping_start=damping_start,
            damping_up=damping_up,
            damping_down=damping_down,
            damping_min=damping_min,
            damping_max=damping_max,
            scaling=scaling,
            attempts=attempts,
            strategy=strategy,
            backend=backend,
            dtype=dtype,
            ftol=ftol,
            xtol=xtol,
            gtol=gtol,
        )
        self._geodesic, self._scaling_memory = check_poor_start_options(
            geodesic,
            scaling_memory,
            geodesic_reject=geodesic_reject,
            geodesic_after=geodesic_after,
            scaling=scaling,
            backend=backend,
            params_per_step=params_per_step,
            process_group=process_group,
        )
        self._cg = check_matrix_free_options(
            cg, strategy=strategy, params_per_step=params_per_step, geodesic=geodesic
        )
        check_point_residual(residual_fn, model, loss_fn=loss_fn, robust_loss=robust_loss)
        robust = check_robust_loss(robust_loss, f_scale, loss_fn)
        check_selection(params_per_step, param_selection, seed, gtol)
        check_limit(memory_limit)
        if robust is not None and not isinstance(residual_fn, PointResidual):
            residual_fn = robust_residual_fn(residual_fn, *robust)
        device_list = options.devices
        if any(str(d).startswith("cuda") for d in device_list):
            # A model GPU that Legate also holds would be shared by two allocators (Legate
            # reserves 95% of its GPUs' memory): refuse before anything is built.
            check_model_devices(device_list)

        self._scope: StepScope = step_scope(process_group, [torch.device(d) for d in device_list])
        self._replicas = Replicas(model, device_list)
        self._scope.sync_parameters(self._replicas)
        # Random subsets must select the same columns on every rank of a group.
        seed = self._scope.common_seed(seed)
        self._engine = JacobianEngine(self._replicas, residual_fn, mode=jacobian_mode)
        self._backend = resolve_backend(options.backend, self._replicas.devices[0])
        # "auto" may have chosen cuPyNumeric: the same refusal as for naming it.
        check_poor_start_options(
            geodesic,
            scaling_memory,
            geodesic_reject=geodesic_reject,
            geodesic_after=geodesic_after,
            scaling=scaling,
            backend=self._backend,
            params_per_step=params_per_step,
            process_group=process_group,
        )
        self._diag: Any = None  # the remembered D of the last step (scaling_memory)
        self._geodesic_reject = geodesic_reject
        self._geodesic_after = geodesic_after
        self._rule = options.rule
        self._residual_fn = residual_fn
        self._robust = robust
        self._loss_fn = loss_fn
        self._learning_rate = options.learning_rate
        self._scaling = options.scaling
        self._attempts = options.attempts
        self._strategy = options.strategy
        self._strategy_reason = ""  # why the planner left the dense strategies, when it did
        self._cg_solver = ConjugateGradients(self._cg)
        self._dtype = options.dtype
        self._stopping = options.stopping
        self._steps = 0
        self._scans = FiniteScans()  # the same batch, unchanged, is scanned once
        self.report: StepReport | None = None
        self._selection = (
            None
            if params_per_step is None
            else ParamSelection(params_per_step, param_selection, self._replicas[0].sizes, seed)
        )
        self._seed = seed
        self._memory_limit = memory_limit
        # The planner may choose subsets itself only when nothing was forced.
        self._auto_subsets = params_per_step is None and strategy == "auto"

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
        return self._learning_rate

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
            loss = self._engine.batch_loss(batch, self._loss_fn)
        return self._scope.mean_loss(loss, batch, custom=self._loss_fn is not None)

    def _loss(self, batch: PreparedBatch) -> float:
        """The loss at the current parameters (non-finite when the forward is)."""
        return float(self._trial_loss(batch))

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
        params = self._replicas.num_params
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
        if not self._fits(batch, slice_size):
            # Too large for the memory, chosen by the planner: matrix-free steps (or, where
            # those do not fit either, subsets) from now on.
            return self.step(inputs, targets, slice_size)
        built = self._scope.assemble(
            self._engine,
            self._backend,
            batch,
            dtype=self._dtype,
            params=batch.params,
            probes=self._cg.probes,
            seed=self._steps,
        )
        matrix_free = built.strategy == "matrix_free"
        backend: ArrayBackend = self._cg_solver if matrix_free else self._backend
        system = built.system
        n = system.rows
        mse_before = system.rss / n
        seconds_trial = 0.0
        if self._loss_fn is None:
            loss_before = mse_before
        else:
            t = time.perf_counter()
            loss_before = self._loss(batch)
            seconds_trial += time.perf_counter() - t
        # Predictions are in MSE units; a custom loss is compared after rescaling.
        scale = loss_before / mse_before if mse_before > 0.0 and math.isfinite(loss_before) else 1.0

        report = StepReport(
            damping=self._rule.damping,
            damping_used=self._rule.damping,
            attempts=0,
            accepted=False,
            loss_before=loss_before,
            loss_after=loss_before,
            strategy=built.strategy,
            strategy_reason=self._strategy_reason or batch.plan.reason,
            backend=backend.name,
            rows=n,
            params=params,
            selected=0 if columns is None else columns.size,
            seconds_jacobian=built.seconds_jacobian,
            seconds_transfer=built.seconds_transfer,
            seconds_assembly=built.seconds_assembly,
            seconds_collective=built.seconds_collective,
        )

        if self._stopping.gtol is not None and self._stopping.gtol_met(
            host_vector(system.gradient), host_vector(system.diag), system.rss, n
        ):
            report.terminated = True
            report.termination = "gtol"
            report.reason = "gtol: the residual is orthogonal to the Jacobian columns"
            return self._finish(report, t_begin, loss_before, terminated=True)

        if self._scaling_memory > 0.0 and not system.underdetermined:
            diag = remembered(system.diag, self._diag, self._scaling_memory)
            system = dataclasses.replace(system, diag=diag)
            self._diag = diag
        accelerate = (
            None
            if self._geodesic is None or self._steps < self._geodesic_after or matrix_free
            else GeodesicAcceleration(
                self._geodesic,
                reject=self._geodesic_reject,
                engine=self._engine,
                batch=batch,
                backend=self._backend,
                system=system,
                scaling=self._scaling,
                replicas=self._replicas,
                learning_rate=self._learning_rate,
            )
        )
        how = Attempts(
            backend=backend if columns is None else SubsetBackend(backend, columns.index, params),
            rule=self._rule,
            scaling=self._scaling,
            attempts=self._attempts,
            learning_rate=self._learning_rate,
            stopping=self._stopping,
            accelerate=accelerate,
        )
        loss_after, terminated = run_attempts(
            how,
            system,
            self._replicas,
            lambda: self._trial_loss(batch),
            report,
            scale=scale,
            seconds_trial=seconds_trial,
        )
        if matrix_free:
            report.products = system.a.products.products
            if report.accepted:
                self._cg_solver.accept()
        return self._finish(report, t_begin, loss_after, terminated=terminated)

    def _fits(self, batch: PreparedBatch, slice_size: int | None) -> bool:
        """True when the step of ``batch`` fits the memory; False when it does not and the
        solver switched to the matrix-free step, or where that does not fit either to
        subsets (nothing forced); raises when a forced choice does not fit. Legate's GPUs
        are sized by ``marquardt-devices`` and not checked here.

        In a process group every rank takes the plan the tightest rank can take, and
        learns whether each rank could plan its share: a rank that refused its share
        (``StepScope.refuse``) lowers the flag, and the others raise
        ``ResidualNotFiniteError``.
        """
        if self._backend.name == "cupynumeric" and batch.strategy != "matrix_free":
            if self._scope.world_size > 1:
                *_, planned = self._scope.least((1, 0, 1))
                if not planned:
                    raise refused_elsewhere(REFUSED)
            return True
        solver_side = self._backend.name == "numpy" and batch.strategy != "matrix_free"
        device = torch.device("cpu") if solver_side else self.devices[0]
        item = self._replicas.dtype.itemsize
        fit = step_memory(
            batch.plan,
            self._replicas.num_params,
            item,
            len(self.devices),
            usable_memory(device, self._memory_limit),
            probes=self._cg.probes,
        )
        fits, fitting_k, planned = self._scope.least((int(fit.fits), fit.fitting_k, 1))
        if not planned:
            raise refused_elsewhere(REFUSED)
        if fits:
            return True
        # Every rank is here (the minimum said "does not fit" to all of them).
        if batch.columns is None and self._auto_subsets and batch.strategy != "matrix_free":
            # The matrix-free step of the same batch: a plan, no Jacobian formed.
            free_plan = self._engine.prepare(
                batch.inputs, batch.targets, slice_size, strategy="matrix_free", checked=True
            ).plan
            free = step_memory(
                free_plan,
                self._replicas.num_params,
                item,
                len(self.devices),
                usable_memory(self.devices[0], self._memory_limit),
                probes=self._cg.probes,
            )
            (free_fits,) = self._scope.least((int(free.fits),))
            if free_fits:
                self._switch_to_matrix_free(batch, fit, free)
                return False
        if batch.columns is None and self._auto_subsets and fitting_k >= 1:
            self._strategy = "auto"
            sizes = self._replicas[0].sizes
            self._selection = ParamSelection(fitting_k, "random", sizes, self._seed)
            warnings.warn(
                f"an LM step on all {self._replicas.num_params} parameters needs "
                f"{fit.formula} = {fit.needed} B but {fit.usable} B are usable "
                f"({fit.source}): stepping on random subsets of k = {fitting_k} "
                "parameters (pass params_per_step= and param_selection= to choose)",
                UserWarning,
                stacklevel=3,
            )
            return False
        if fit.fits:
            raise SolverConfigError(
                message(
                    "this step fits this rank's memory",
                    "another rank of the process group has too little memory for it",
                    "read that rank's error; give every rank the same memory_limit and devices",
                )
            )
        what = (
            f"strategy={batch.strategy!r} on all {self._replicas.num_params} parameters"
            if batch.columns is None
            else f"params_per_step={batch.columns.size} (strategy={batch.strategy!r})"
        )
        raise fit.refuse(what)

    def _switch_to_matrix_free(
        self, batch: PreparedBatch, dense: StepMemory, free: StepMemory
    ) -> None:
        """Strategy "matrix_free" from now on, and why (the warning, ``report``)."""
        p, n = self._replicas.num_params, batch.rows
        system = f"{p} x {p} (JᵀJ)" if batch.strategy == "accumulate" else f"{n} x {n} (JJᵀ)"
        self._strategy = "matrix_free"
        self._strategy_reason = (
            f"matrix_free: the {batch.strategy} step's {system} system needs "
            f"{dense.formula} = {dense.needed} B but {dense.usable} B are usable "
            f"({dense.source}), and the other dense form is larger; the matrix-free step "
            f"needs at most {free.formula} = {free.needed} B"
        )
        warnings.warn(
            f"an LM step on all {p} parameters does not fit: {self._strategy_reason}. "
            "Stepping matrix-free (conjugate gradients on products JᵀJv) from now on "
            "(pass strategy= to choose)",
            UserWarning,
            stacklevel=4,
        )

    def _finish(
        self, report: StepReport, t_begin: float, loss: float, *, terminated: bool
    ) -> tuple[float, bool]:
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
        if self._robust is not None:
            raise SolverConfigError(
                message(
                    "LMA.covariance gives the least-squares covariance",
                    f"this LMA minimises the robust loss {self._robust[0]!r}",
                    "fit with curve_fit(..., loss=...), whose covariance follows SciPy's for "
                    "robust losses, or build the LMA without robust_loss",
                )
            )
        inputs, targets, slice_size = check_batch(
            inputs, targets, slice_size, dtype=self._replicas.dtype, home=self._replicas.devices
        )
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
        cursor, the random generator), so a resumed run selects what it would have.
        """
        state = solver_state(self._rule, self._steps, self._learning_rate, self._scaling)
        if self._selection is not None:
            state["param_selection"] = self._selection.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; checks everything before changing anything."""
        selection = self._selection
        saved = state.get("param_selection") if isinstance(state, dict) else None
        if selection is None and self._auto_subsets and saved is not None:
            # Saved after the planner switched to subsets: resume the same way.
            selection = ParamSelection.resumed(saved, self._replicas[0].sizes, self._seed)
        if selection is not None and isinstance(state, dict):
            state = {k: v for k, v in state.items() if k != "param_selection"}
        damping_state, steps = checked_state(state, self._rule)
        if selection is not None:
            selection.load_state_dict(saved)
        self._selection = selection
        self._rule.load_state_dict(damping_state)
        self._steps = steps
