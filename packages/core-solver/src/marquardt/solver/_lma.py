"""The Levenberg-Marquardt algorithm for PyTorch models: :class:`LMA`.

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

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ._backend_choice import BACKEND_CHOICES, resolve_backend
from ._backends.base import ArrayBackend, LinearSystem, host_vector
from ._damping import DampingRule, FixedDamping, NielsenDamping, gain_ratio
from ._errors import SolverConfigError, SolverInputError, SolverStateError
from ._report import StepReport
from ._scaling import SCALINGS
from ._stopping import StoppingCriteria

__all__ = ["DAMPING_RULES", "LMA", "STRATEGIES"]

ResidualFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LossFn = Callable[..., Any]

#: Names accepted by ``LMA(damping=...)`` (or pass a ``DampingRule`` instance).
DAMPING_RULES: tuple[str, ...] = ("fixed", "nielsen")
#: Names accepted by ``LMA(strategy=...)``.
STRATEGIES: tuple[str, ...] = ("auto", "explicit", "accumulate")

_STATE_FORMAT = "marquardt.solver.LMA/1"

#: A trial loss must be lower than the loss at the start of the step by more than this many
#: units of rounding (machine epsilon of the parameters' dtype, relative to the loss) to
#: count as a decrease: differences below that are rounding noise of the loss evaluation.
NOISE_ULPS = 16.0


def _fail(asked: str, found: str, hint: str) -> str:
    return f"{asked}, but {found}. HINT: {hint}"


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are the same (``cuda`` without an index is ``cuda:0``)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def _positive_number(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SolverConfigError(
            _fail(
                f"LMA({name}=...) expects a number",
                f"got {type(value).__name__}",
                f"pass a float, e.g. {name}=1.0",
            )
        )
    number = float(value)
    if not math.isfinite(number) or number < 0.0 or (number == 0.0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise SolverConfigError(
            _fail(
                f"LMA({name}=...) expects a finite number {bound}",
                f"got {value!r}",
                f"pass a finite {name} {bound}",
            )
        )
    return number


class LMA:
    """Levenberg-Marquardt training of ``model`` (see the module docstring for the maths).

    ``model`` must sit on one of ``devices`` (it is replicated on each for data-parallel
    Jacobians). ``residual_fn(outputs, targets)`` gives the residuals (e.g. ``a - b``).
    ``loss_fn(outputs, targets)``, when given, decides acceptance instead of the mean of
    squared residuals. ``learning_rate`` scales every step (θ ← θ − lr·δ). ``damping`` is
    "nielsen" (the default: Nielsen's gain-ratio rule) or "fixed" (λ·up on rejection,
    λ·down on acceptance), or any ``DampingRule``; λ starts at ``damping_start`` and stays
    in [damping_min, damping_max]. ``scaling`` is "marquardt" (the default: D =
    diag(JᵀJ)/N, clamped) or "identity" (D = I). The defaults are the measured best on the
    seed's sinc loop (fewer rejected attempts per step, lower loss per step). At most
    ``attempts`` damped solves per step. ``strategy``: "accumulate" (JᵀJ, Jᵀr summed on
    the model devices), "explicit" (J assembled by the backend; needed for the
    under-determined form) or "auto" (the Jacobian planner: accumulate when N ≥ P).
    ``backend``: "auto", "cupynumeric", "torch", "numpy" or an ``ArrayBackend``. ``dtype``
    is the dtype the normal products are accumulated in (None: the parameters' dtype);
    factorisations are float64 always. ``ftol`` / ``xtol`` / ``gtol``: MINPACK-style
    stopping tests, off unless set. ``jacobian_mode`` is handed to the Jacobian engine.

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
    ) -> None:
        # Every argument is checked before anything is built or the model is touched.
        if not isinstance(model, nn.Module):
            raise SolverConfigError(
                _fail(
                    "LMA(model, ...) expects a torch.nn.Module",
                    f"got {type(model).__name__}",
                    "wrap the function in an nn.Module whose parameters are the unknowns",
                )
            )
        if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence):
            raise SolverConfigError(
                _fail(
                    "LMA(model, devices, ...) expects a list of devices",
                    f"got {devices!r}",
                    "pass a list, e.g. [torch.device('cpu')] or get_available_gpus()",
                )
            )
        if not callable(residual_fn):
            raise SolverConfigError(
                _fail(
                    "LMA(..., residual_fn) expects a callable (outputs, targets) -> residuals",
                    f"got {type(residual_fn).__name__}",
                    "pass e.g. lambda a, b: a - b",
                )
            )
        if loss_fn is not None and not callable(loss_fn):
            raise SolverConfigError(
                _fail(
                    "LMA(loss_fn=...) expects a callable or None",
                    f"got {type(loss_fn).__name__}",
                    "pass None for the mean squared residual",
                )
            )
        lr = _positive_number("learning_rate", learning_rate)
        start = _positive_number("damping_start", damping_start)
        lo = _positive_number("damping_min", damping_min)
        hi = _positive_number("damping_max", damping_max)
        up = _positive_number("damping_up", damping_up)
        down = _positive_number("damping_down", damping_down)
        if not lo <= hi:
            raise SolverConfigError(
                _fail(
                    "LMA expects damping_min ≤ damping_max",
                    f"got damping_min={lo:g}, damping_max={hi:g}",
                    "swap or fix the bounds",
                )
            )
        if not up > 1.0 or not down < 1.0:
            raise SolverConfigError(
                _fail(
                    "LMA expects damping_up > 1 and damping_down < 1",
                    f"got damping_up={up:g}, damping_down={down:g}",
                    "λ must grow on rejection and shrink on acceptance, e.g. 10 and 0.1",
                )
            )
        rule: DampingRule
        if isinstance(damping, str):
            if damping not in DAMPING_RULES:
                raise SolverConfigError(
                    _fail(
                        f"LMA(damping={damping!r}) names a damping rule",
                        f"the known rules are {DAMPING_RULES}",
                        "use 'fixed' or 'nielsen', or pass a DampingRule instance",
                    )
                )
            rule = (
                FixedDamping(start, up=up, down=down, minimum=lo, maximum=hi)
                if damping == "fixed"
                else NielsenDamping(start, minimum=lo, maximum=hi)
            )
        elif isinstance(damping, DampingRule):
            rule = damping
        else:
            raise SolverConfigError(
                _fail(
                    "LMA(damping=...) expects 'fixed', 'nielsen' or a DampingRule",
                    f"got {type(damping).__name__}",
                    "pass damping='fixed'",
                )
            )
        if scaling not in SCALINGS:
            raise SolverConfigError(
                _fail(
                    f"LMA(scaling={scaling!r}) names a scaling",
                    f"the known ones are {SCALINGS}",
                    "use 'identity' (D = I) or 'marquardt' (D = diag(JᵀJ))",
                )
            )
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise SolverConfigError(
                _fail(
                    "LMA(attempts=...) expects an integer ≥ 1",
                    f"got {attempts!r}",
                    "pass e.g. attempts=10",
                )
            )
        if strategy not in STRATEGIES:
            raise SolverConfigError(
                _fail(
                    f"LMA(strategy={strategy!r}) names a strategy",
                    f"the known ones are {STRATEGIES}",
                    "use 'auto', 'explicit' (J assembled) or 'accumulate' (JᵀJ summed)",
                )
            )
        if isinstance(backend, str) and backend not in BACKEND_CHOICES:
            raise SolverConfigError(
                _fail(
                    f"LMA(backend={backend!r}) names a backend",
                    f"the known ones are {BACKEND_CHOICES}",
                    "use backend='auto'",
                )
            )
        if dtype is not None and (
            not isinstance(dtype, torch.dtype) or not dtype.is_floating_point
        ):
            raise SolverConfigError(
                _fail(
                    "LMA(dtype=...) expects a floating torch.dtype or None",
                    f"got {dtype!r}",
                    "pass torch.float32, torch.float64 or None (the parameters' dtype)",
                )
            )
        tolerances = {
            name: None if value is None else _positive_number(name, value, allow_zero=True)
            for name, value in (("ftol", ftol), ("xtol", xtol), ("gtol", gtol))
        }

        device_list = list(devices)
        if any(str(d).startswith("cuda") for d in device_list):
            # A model GPU that Legate also holds would be shared by two allocators (Legate
            # reserves 95% of its GPUs' memory): refuse before anything is built.
            from marquardt.devices import check_model_devices

            check_model_devices(device_list)

        from marquardt.jacobian import JacobianEngine, Replicas

        self._replicas = Replicas(model, device_list)
        self._engine = JacobianEngine(self._replicas, residual_fn, mode=jacobian_mode)
        self._backend = resolve_backend(backend, self._replicas.devices[0])
        self._rule = rule
        self._residual_fn = residual_fn
        self._loss_fn = loss_fn
        self._learning_rate = lr
        self._scaling = scaling
        self._attempts = attempts
        self._strategy = strategy
        self._dtype = dtype
        self._stopping = StoppingCriteria(**tolerances)
        self._steps = 0
        self.report: StepReport | None = None

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

    # -- validation ----------------------------------------------------------------------
    def _validate_batch(
        self, inputs: object, targets: object, slice_size: object
    ) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        for name, value in (("inputs", inputs), ("targets", targets)):
            if not isinstance(value, torch.Tensor):
                raise SolverInputError(
                    _fail(
                        f"LMA.step expects {name} as a torch.Tensor",
                        f"got {type(value).__name__}",
                        "convert with torch.as_tensor(...)",
                    )
                )
        assert isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor)
        if inputs.dim() == 0 or targets.dim() == 0:
            raise SolverInputError(
                _fail(
                    "LMA.step expects batched inputs and targets (samples along dim 0)",
                    f"got shapes {tuple(inputs.shape)} and {tuple(targets.shape)}",
                    "add a batch dimension, e.g. x.unsqueeze(0)",
                )
            )
        batch = int(inputs.shape[0])
        if batch == 0:
            raise SolverInputError(
                _fail(
                    "LMA.step expects a batch of at least one sample",
                    "the batch is empty",
                    "skip empty batches",
                )
            )
        if int(targets.shape[0]) != batch:
            raise SolverInputError(
                _fail(
                    "LMA.step expects as many targets as inputs along dim 0",
                    f"got {batch} inputs and {int(targets.shape[0])} targets",
                    "pass matching (x, y) pairs, e.g. from one DataLoader batch",
                )
            )
        dtype = self._replicas.dtype
        home = self._replicas.devices
        for name, value in (("inputs", inputs), ("targets", targets)):
            if value.is_floating_point() and value.dtype != dtype:
                raise SolverInputError(
                    _fail(
                        f"LMA.step expects floating {name} in the parameters' dtype {dtype}",
                        f"{name} are {value.dtype}",
                        f"convert them with {name}.to({dtype}) (or the model with "
                        f"model.to({value.dtype}) before building the LMA)",
                    )
                )
            if value.device.type != "cpu" and not any(_same_device(value.device, d) for d in home):
                raise SolverInputError(
                    _fail(
                        f"LMA.step expects {name} on the host or on a model device "
                        f"({', '.join(map(str, home))})",
                        f"{name} are on {value.device}",
                        f"move them with {name}.to({str(home[0])!r}) or keep them on the CPU",
                    )
                )
        for name, value in (("inputs", inputs), ("targets", targets)):
            floating = value.is_floating_point() or value.is_complex()
            if floating and not bool(torch.isfinite(value).all()):
                raise SolverInputError(
                    _fail(
                        f"LMA.step expects finite {name}",
                        f"{name} contain {int((~torch.isfinite(value)).sum())} NaN/inf values",
                        "clean the data; nothing was changed",
                    )
                )
        if slice_size is None:
            return inputs, targets, None
        if isinstance(slice_size, bool) or not isinstance(slice_size, int) or slice_size < 1:
            raise SolverInputError(
                _fail(
                    "LMA.step expects slice_size to be None or an integer ≥ 1",
                    f"got {slice_size!r}",
                    "pass e.g. slice_size=batch_size // num_devices",
                )
            )
        if slice_size > batch:
            raise SolverInputError(
                _fail(
                    f"LMA.step was given slice_size={slice_size} for a batch of {batch} samples",
                    "a slice cannot hold more samples than the batch",
                    "pass slice_size=min(slice_size, len(x)) or None (one slice per device), "
                    "or drop the last, shorter batch (DataLoader(drop_last=True))",
                )
            )
        return inputs, targets, int(slice_size)

    # -- the step ------------------------------------------------------------------------
    def _plan(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None
    ) -> tuple[int, str]:
        """(N rows, strategy) from the Jacobian planner ("auto": accumulate when N ≥ P)."""
        plan = self._engine.plan(inputs, targets, slice_size, strategy=self._strategy)
        return int(plan.rows), str(plan.strategy)

    def _engine_seconds(self) -> tuple[float, float, float]:
        """(jacobian, transfer, gram) seconds of the engine's last call."""
        timings: dict[str, float] = dict(getattr(self._engine, "timings", {}) or {})
        return (
            float(timings.get("jacobian", 0.0)),
            float(timings.get("transfer", 0.0)),
            float(timings.get("gram", 0.0)),
        )

    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None) -> float:
        """The loss at the current parameters; NaN when the forward is not finite."""
        from marquardt.jacobian import JacobianError

        with torch.no_grad():
            try:
                value = self._engine.loss(inputs, targets, slice_size, loss_fn=self._loss_fn)
            except JacobianError:
                # The engine refuses non-finite residuals; at a trial point that is a
                # rejected attempt, not an error.
                return float("nan")
        return float(value)

    def step(
        self, inputs: torch.Tensor, targets: torch.Tensor, slice_size: int | None = None
    ) -> tuple[float, bool]:
        """One LM step on the batch (inputs, targets); returns (loss, terminated).

        ``loss`` is the loss on this batch at the parameters the model holds after the
        step (the accepted point, or the start when nothing was accepted). ``slice_size``
        is how many samples each Jacobian slice holds (None: the whole batch in one).
        """
        inputs, targets, slice_size = self._validate_batch(inputs, targets, slice_size)
        t_begin = time.perf_counter()
        rule = self._rule
        lr = self._learning_rate
        params = self._replicas.num_params
        rows, strategy = self._plan(inputs, targets, slice_size)

        t0 = time.perf_counter()
        system: LinearSystem
        if strategy == "accumulate":
            products = self._engine.accumulate(inputs, targets, slice_size, dtype=self._dtype)
            system = self._backend.system_from_products(products)
        else:
            system = self._backend.system_from_slices(
                self._engine.slices(inputs, targets, slice_size), rows, params
            )
        self._backend.synchronize()
        elapsed = time.perf_counter() - t0
        # The engine reports per call: for "accumulate" its Jacobian time includes the
        # JᵀJ products ("gram"), which are assembly; for "explicit" the slices are
        # produced while the backend copies them, so the split is approximate.
        jacobian_s, transfer_s, gram_s = self._engine_seconds()
        seconds_jacobian = max(0.0, jacobian_s - gram_s - transfer_s)
        seconds_transfer = transfer_s
        seconds_assembly = max(0.0, elapsed - seconds_jacobian - seconds_transfer)

        n = system.rows
        mse_before = system.rss / n
        seconds_trial = 0.0
        if self._loss_fn is None:
            loss_before = mse_before
        else:
            t = time.perf_counter()
            loss_before = self._loss(inputs, targets, slice_size)
            seconds_trial += time.perf_counter() - t
        # Predictions are in MSE units; a custom loss is compared after rescaling.
        scale = loss_before / mse_before if mse_before > 0.0 and math.isfinite(loss_before) else 1.0

        report = StepReport(
            damping=rule.damping,
            damping_used=rule.damping,
            attempts=0,
            accepted=False,
            loss_before=loss_before,
            loss_after=loss_before,
            strategy=strategy,
            backend=self._backend.name,
            rows=n,
            params=params,
            seconds_jacobian=seconds_jacobian,
            seconds_transfer=seconds_transfer,
            seconds_assembly=seconds_assembly,
        )

        if self._stopping.gtol is not None and self._stopping.gtol_met(
            host_vector(system.gradient), host_vector(system.diag), system.rss, n
        ):
            report.terminated = True
            report.termination = "gtol"
            report.reason = "gtol: the residual is orthogonal to the Jacobian columns"
            return self._finish(report, t_begin, loss_before, terminated=True)

        param_norm = (
            float(self._replicas.flat_params().double().norm())
            if self._stopping.xtol is not None
            else 0.0
        )
        self._replicas.backup()
        noise = NOISE_ULPS * torch.finfo(self._replicas.dtype).eps
        seconds_solve = 0.0
        accepted = False
        loss_after = loss_before
        terminated = False
        last_delta_norm = 0.0
        for _ in range(self._attempts):
            lam = rule.damping
            report.damping_used = lam
            report.attempts += 1
            t = time.perf_counter()
            solution = self._backend.solve(system, lam, self._scaling)
            self._backend.synchronize()
            seconds_solve += time.perf_counter() - t
            if solution is None or not bool(torch.isfinite(solution.delta).all()):
                report.rejections.append(
                    "cholesky failed" if solution is None else "non-finite step"
                )
                rule.on_reject()
            else:
                self._replicas.add_(solution.delta, alpha=-lr)
                t = time.perf_counter()
                trial = self._loss(inputs, targets, slice_size)
                seconds_trial += time.perf_counter() - t
                predicted = solution.predicted_reduction(lr) * scale
                actual = loss_before - trial
                report.predicted_reduction = predicted
                report.gain_ratio = gain_ratio(actual, predicted)
                # A reduction below the rounding error of the loss itself is noise, not
                # progress: counting it would let a converged run wander on forever.
                significant = actual > noise * abs(loss_before)
                if math.isfinite(trial) and significant and rule.accepts(actual, predicted):
                    rule.on_accept(actual, predicted)
                    accepted = True
                    loss_after = trial
                    last_delta_norm = lr * float(solution.delta.norm())
                    if self._stopping.ftol_met(loss_before, actual, predicted):
                        terminated, report.termination = True, "ftol"
                        report.reason = "ftol: relative reductions of the loss ≤ ftol"
                    elif self._stopping.xtol_met(last_delta_norm, param_norm):
                        terminated, report.termination = True, "xtol"
                        report.reason = "xtol: relative change of the parameters ≤ xtol"
                    break
                self._replicas.restore()
                report.rejections.append(
                    "non-finite loss"
                    if not math.isfinite(trial)
                    else "loss did not decrease beyond rounding"
                    if actual > 0.0
                    else "loss did not decrease"
                )
                rule.on_reject()
            if rule.at_ceiling:
                terminated, report.termination = True, "damping_max"
                report.reason = (
                    f"damping reached its ceiling {rule.maximum:g} without lowering the loss "
                    f"({report.attempts} attempts: {', '.join(report.rejections)})"
                )
                break

        report.accepted = accepted
        report.loss_after = loss_after
        report.step_norm = last_delta_norm
        report.seconds_solve = seconds_solve
        report.seconds_trial = seconds_trial
        if not report.reason:
            report.reason = (
                f"accepted after {report.attempts} attempt(s)"
                if accepted
                else f"no attempt lowered the loss in {report.attempts} attempts "
                f"({', '.join(report.rejections)}); parameters unchanged"
            )
        return self._finish(report, t_begin, loss_after, terminated=terminated)

    def _finish(
        self, report: StepReport, t_begin: float, loss: float, *, terminated: bool
    ) -> tuple[float, bool]:
        report.terminated = terminated
        report.damping = self._rule.damping
        report.seconds_total = time.perf_counter() - t_begin
        self.report = report
        self._steps += 1
        return float(loss), bool(terminated)

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The solver's state: the damping rule's state (λ, ν), step count, settings.

        The model's parameters are not included (save ``lma.model.state_dict()``).
        """
        return {
            "format": _STATE_FORMAT,
            "damping_rule": self._rule.name,
            "damping_state": dict(self._rule.state_dict()),
            "steps": self._steps,
            "learning_rate": self._learning_rate,
            "scaling": self._scaling,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; checks everything before changing anything."""
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            found = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise SolverStateError(
                _fail(
                    f"load_state_dict expects a dict of format {_STATE_FORMAT!r}",
                    f"got {found!r}",
                    "pass what LMA.state_dict() returned",
                )
            )
        if state.get("damping_rule") != self._rule.name:
            raise SolverStateError(
                _fail(
                    f"load_state_dict was given the state of damping rule "
                    f"{state.get('damping_rule')!r}",
                    f"this solver uses {self._rule.name!r}",
                    "construct the LMA with the same damping= as the one saved",
                )
            )
        damping_state = state.get("damping_state")
        if (
            not isinstance(damping_state, dict)
            or "damping" not in damping_state
            or not all(
                isinstance(v, (int, float)) and math.isfinite(float(v)) and float(v) > 0.0
                for v in damping_state.values()
            )
        ):
            raise SolverStateError(
                _fail(
                    "load_state_dict expects damping_state with a finite positive 'damping'",
                    f"got {damping_state!r}",
                    "pass what LMA.state_dict() returned",
                )
            )
        steps = state.get("steps", 0)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise SolverStateError(
                _fail(
                    "load_state_dict expects 'steps' as an integer ≥ 0",
                    f"got {steps!r}",
                    "pass what LMA.state_dict() returned",
                )
            )
        self._rule.load_state_dict({k: float(v) for k, v in damping_state.items()})
        self._steps = steps
