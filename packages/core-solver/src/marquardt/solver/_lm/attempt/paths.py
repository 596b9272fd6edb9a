"""Which path a step's attempts take, and why: `AttemptPaths`.

The eager attempts (``attempt.eager``) serve every step. Where a step's attempts can be one
pure tensor function (``attempt.pure``): a dense system in torch tensors on one
model device, the whole batch in one forward, a damping rule with a tensor form, and none
of parameter subsets, geodesic acceleration, point residuals or a process group, the
function is compiled on CPUs (``torch.compile``, inductor's C++) and captured as a CUDA
graph on GPUs (``attempt.graphs``). ``compile_attempt`` ("auto", "on" or "off") decides:
"off" keeps the eager attempts; "on" compiles or captures at the first step that allows
it; "auto" captures on GPUs once a second step has the same shapes (shapes are static), and on
CPUs keeps the eager attempts, which the compiled one does not beat by its compile time. The
compiled or captured function is kept per shapes and reused; a failure to compile or to
capture keeps the eager attempts from then on, with the reason in the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from marquardt.jacobian import PointResidual, PreparedBatch, Replicas

from ..._backends.base import LinearSystem
from ..._backends.scaling import scaling_diagonal_torch
from ..damping import tensor_rule
from ..damping.base import DampingRule
from ..options import Options
from .decide import NOISE_ULPS
from .graphs import capture_attempt, compile_attempt
from .pure import AttemptResult, AttemptSpec, lm_attempt, trial_loss_fn

__all__ = ["AttemptChoice", "AttemptPaths", "AttemptStep"]

#: Why "auto" keeps the eager attempts on CPUs: compiling takes seconds per model and
#: shapes, and the compiled attempt measured no faster than the eager one, from small fits
#: to the tutorial's network (the attempt is a LAPACK factorisation and a short forward).
_CPU_AUTO = (
    "on CPUs the compiled attempt does not repay its compile time (compile_attempt='on' forces it)"
)

Runner = Callable[..., AttemptResult]


@dataclass(frozen=True)
class AttemptChoice:
    """How this step's attempts run: ``runner`` (None: the eager attempts), the path's
    name for the report (``StepReport.attempt_path``) and why."""

    runner: Runner | None
    path: str
    reason: str


@dataclass(frozen=True)
class AttemptStep:
    """What decides whether a step's attempts can be one tensor function.

    Arguments:
        system: the step's assembled system.
        batch: the step's prepared batch.
        subset: whether the step is on a parameter subset.
        accelerated: whether the geodesic acceleration is on for this step.
        replicas: the model's replicas.
        options: the solver's options.
        rule: the damping rule.
        scaling: the name of the scaling D.
        fused: whether the step's linear solver is the one the tensor attempt runs.
    """

    system: LinearSystem
    batch: PreparedBatch
    subset: bool
    accelerated: bool
    replicas: Replicas
    options: Options
    rule: DampingRule
    scaling: str
    fused: bool = True


#: Each condition that keeps the eager attempts, with its reason.
_REFUSALS: tuple[tuple[Callable[[AttemptStep, int], bool], str], ...] = (
    (
        lambda s, world: not isinstance(s.system.a, torch.Tensor),
        "the system is not in torch tensors",
    ),
    (lambda s, world: s.batch.strategy == "matrix_free", "matrix-free steps solve by CG"),
    (lambda s, world: s.subset, "steps on parameter subsets"),
    (lambda s, world: s.accelerated, "the geodesic acceleration"),
    (lambda s, world: len(s.replicas) > 1, "several model devices"),
    (lambda s, world: world > 1, "a process group"),
    (lambda s, world: tensor_rule(s.rule) is None, "a damping rule without a tensor form"),
    (lambda s, world: not s.fused, "a linear solver without a tensor form"),
    (
        lambda s, world: isinstance(s.options.residual_fn, PointResidual),
        "residuals that differentiate the model by its inputs",
    ),
    (
        lambda s, world: s.batch.forward_samples < s.batch.samples,
        "the trial forward needs several slices to fit the memory",
    ),
)


def _arguments(step: AttemptStep) -> tuple[Any, ...]:
    """The runner's arguments for this step (zeros for θ's state, which a call replaces)."""
    replica, system = step.replicas[0], step.system
    device = replica.device
    return (
        replica.flat,
        *(torch.zeros((), dtype=torch.float64, device=device),) * 3,
        torch.ones((), dtype=torch.float64, device=device),
        system.a,
        system.g,
        system.scale(step.scaling, scaling_diagonal_torch),
        step.batch.inputs.to(device),
        step.batch.targets.to(device),
        system.jacobian if system.underdetermined else None,
    )


def _spec(step: AttemptStep) -> AttemptSpec:
    """The attempts' constants for this step."""
    replica, options = step.replicas[0], step.options
    return AttemptSpec(
        trial_loss=trial_loss_fn(
            replica.module,
            replica.param_dict,
            options.residual_fn,  # type: ignore[arg-type]  # a PointResidual is refused
            options.loss_fn,
        ),
        rule=tensor_rule(step.rule),  # type: ignore[arg-type]
        learning_rate=options.learning_rate,
        noise=NOISE_ULPS * torch.finfo(step.replicas.dtype).eps,
        underdetermined=step.system.underdetermined,
        rows=step.system.rows,
    )


def _key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        (tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args
    )


class AttemptPaths:
    """Chooses each step's attempt path and keeps what it built across steps.

    Arguments:
        mode: ``"auto"``, ``"on"`` or ``"off"`` (``option_checks.ATTEMPT_MODES``).
        world_size: the ranks sharing each step.
        compiler: what compiles the function on CPUs (None: ``torch.compile``).
        name: the path's name in the report when ``compiler`` is given.
    """

    def __init__(
        self,
        mode: str,
        *,
        world_size: int = 1,
        compiler: Callable[[Runner], Runner] | None = None,
        name: str = "compiled",
    ) -> None:
        self.mode = mode
        self.world_size = world_size
        self._compiler = compiler
        self._name = name
        self._runners: dict[tuple[Any, ...], AttemptChoice] = {}
        self._last: tuple[Any, ...] | None = None
        self._failed = ""

    def choose(self, step: AttemptStep) -> AttemptChoice:
        """The path of this step's attempts (see the module docstring).

        Arguments:
            step: what decides it.

        Returns:
            The `AttemptChoice`.
        """
        if self.mode == "off":
            return AttemptChoice(None, "eager", "compile_attempt='off'")
        for refused, why in _REFUSALS:
            if refused(step, self.world_size):
                return AttemptChoice(None, "eager", why)
        if self._failed:
            return AttemptChoice(None, "eager", self._failed)
        replica = step.replicas[0]
        if self.mode == "auto" and replica.device.type == "cpu":
            return AttemptChoice(None, "eager", _CPU_AUTO)
        args = _arguments(step)
        key = _key(args)
        held = self._runners.get(key)
        if held is not None:
            self._last = key
            return held
        static, self._last = key == self._last, key
        if self.mode == "auto" and not static:
            return AttemptChoice(None, "eager", "shapes not yet seen twice (auto)")
        fn: Runner = partial(lm_attempt, _spec(step))
        choice = self._build(fn, args, replica.device)
        if choice.runner is None:
            self._failed = choice.reason
        else:
            self._runners[key] = choice
        return choice

    def _build(self, fn: Runner, args: tuple[Any, ...], device: torch.device) -> AttemptChoice:
        forced = self.mode == "on"
        if device.type == "cpu":
            compiled, failed = compile_attempt(fn, args, self._compiler)
            if compiled is None:
                return AttemptChoice(None, "eager", failed)
            why = "compile_attempt='on'" if forced else "static shapes and a small attempt"
            return AttemptChoice(compiled, self._name, why)
        runner, path, failed = capture_attempt(fn, args, device)
        if path != "captured":
            return AttemptChoice(None, "eager", failed)
        why = "compile_attempt='on'" if forced else "static shapes on a CUDA device"
        return AttemptChoice(runner, path, why)
