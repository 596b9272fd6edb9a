"""The matrix-free damped solve: truncated, preconditioned conjugate gradients,
`ConjugateGradients` (its options: `TruncatedCG`, ``solve.cg_options``).

Where neither ``JᵀJ`` (P × P) nor ``JJᵀ`` (N × N) fits, the step solves

    (A + λD) δ = g,   A = JᵀJ/N,  g = Jᵀr/N,

by conjugate gradients (Hestenes & Stiefel 1952) on the operator ``v ↦ Av``, which the
Jacobian engine forms from one Jacobian-vector and one vector-Jacobian product per slice
(``marquardt.jacobian.GaussNewtonProducts``; Schraudolph 2002; Martens 2010), assembled
as ``_lm.matrix_free.matrix_free_system``. A is never formed. The pieces:

* the curvature from a subsample (``solve.curvature``; Martens 2010): g from the whole
  batch, the products Av from |S| samples drawn afresh each step, scaled by N/|S|;
* a preconditioner built once per step (``solve.preconditioners``): the randomized Nyström
  preconditioner of Frangella, Tropp & Udell 2023 (``"nystrom"``, a rank-k sketch from
  one block of k products) or M = d̂ + λD (``"jacobi"``), with d̂ the Hutchinson estimate
  of diag(JᵀJ)/N (floored as Marquardt's scaling is);
* D is the step's scaling (``scaling="marquardt"``: d̂ floored; "identity": I), and I
  when N < P, as in the dense under-determined step (JJᵀ/N + λI)u = r/N, whose δ = Jᵀu
  solves (JᵀJ/N + λI)δ = Jᵀr/N: the damping rules, the attempts and the stopping tests
  are those of the dense step;
* truncation (Steihaug 1983; Toint 1981): stop when the relative residual
  ‖g − (A + λD)x‖ / ‖g‖ ≤ ``tolerance``, after ``iterations`` iterations, or on a direction
  of non-positive curvature (rounding, when λ is tiny and J rank-deficient), keeping the
  last iterate. Every CG iterate lowers the quadratic model from x = 0, so a truncated x
  is a descent step whose predicted reduction is exact for that x;
* warm start (Martens 2010): x₀ = ``warm_start`` × the last *accepted* δ (a rejected
  attempt's δ was too long: starting the next, more damped attempt from it lets the
  relative-residual test pass at once, near the step just rejected), dropped for x₀ = 0
  when it models no decrease (q(x₀) ≥ 0); it costs one product.

The subsample's and the sketch's random draws come from one generator, seeded by the
solver's seed, whose state (with the warm start) is the solver's ``state_dict``.

δᵀg and δᵀAδ of the returned δ are tracked through the iterations (Ax is updated with
each Ap), so the gain ratio's prediction is exact for the truncated δ at no extra product.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..._backends.base import FAILED_NON_FINITE, LinearSystem, Solution
from ..._backends.scaling import scaling_diagonal_torch
from ..._errors import SolverStateError, message
from ..matrix_free import GaussNewtonOperator
from .cg_options import TruncatedCG
from .curvature import curvature_size, draw_samples
from .kind import LinearSolver, SolverKind, SolverParts
from .preconditioners import PRECONDITIONERS, Preconditioner

__all__ = [
    "CG_STOPS",
    "CG_VECTORS",
    "FAILED_CURVATURE",
    "KIND",
    "SKETCH_VECTORS",
    "ConjugateGradients",
]

#: ``Solution.status`` of a matrix-free solve that met non-positive curvature before moving.
FAILED_CURVATURE = 3.0
#: Why a solve's iterations stopped (``StepReport.cg_stops``).
CG_STOPS: tuple[str, ...] = ("tolerance", "budget", "curvature", "non-finite")
#: P-sized float64 vectors a matrix-free step holds at once (x, r, z, p, Ap, Ax, g, the
#: estimate d̂, D, M, the warm start), besides the probes' Jᵀz and the preconditioner's
#: sketch (``SKETCH_VECTORS`` per unit of rank): its memory is O(P).
CG_VECTORS = 11
#: P-sized float64 vectors per unit of the Nyström rank while the sketch is formed (the
#: test matrix, its products, the factor, the basis kept).
SKETCH_VECTORS = 4


class ConjugateGradients:
    """The damped solve of a matrix-free system (a `LinearSolver`): truncated
    preconditioned CG, warm-started from the last accepted δ
    (``accept`` tells it which δ that was); its random draws come from a generator seeded
    by ``seed`` (None: 0)."""

    name = "cg"

    def __init__(self, options: TruncatedCG, seed: int | None = None) -> None:
        self.options = options
        self._previous: torch.Tensor | None = None  # the warm start's δ
        self._last: torch.Tensor | None = None  # the last solve's δ
        self._generator = torch.Generator().manual_seed(0 if seed is None else int(seed))
        self._used = False  # whether a step has drawn from the generator
        # The step's preconditioner, built once per (system, scaling).
        self._prepared: tuple[object, str, Preconditioner] | None = None

    def synchronize(self) -> None:
        """Nothing queued: every iteration reads its scalars."""

    def accept(self) -> None:
        """The last solve's δ was accepted: the next step's attempts start from it."""
        self._previous = self._last

    def forget(self) -> None:
        """Drop the warm start (the next solve starts from x₀ = 0)."""
        self._previous = self._last = None

    @property
    def used(self) -> bool:
        """Whether a matrix-free step was taken (the state is then worth saving)."""
        return self._used

    def state_dict(self) -> dict[str, Any]:
        """The warm start (a float64 CPU tensor, or None) and the generator's state."""
        previous = None if self._previous is None else self._previous.detach().cpu().clone()
        return {"warm_start": previous, "generator": self._generator.get_state()}

    @staticmethod
    def check_state(state: object) -> None:
        """Refuse a state that ``state_dict`` cannot have returned (nothing changes)."""
        ok = (
            isinstance(state, dict)
            and set(state) == {"warm_start", "generator"}
            and (state["warm_start"] is None or isinstance(state["warm_start"], torch.Tensor))
            and isinstance(state["generator"], torch.Tensor)
            and state["generator"].dtype == torch.uint8
        )
        if not ok:
            raise SolverStateError(
                message(
                    "load_state_dict expects 'matrix_free' as {'warm_start', 'generator'}",
                    f"got {type(state).__name__}"
                    + (f" with keys {sorted(state)}" if isinstance(state, dict) else ""),
                    "pass what LMA.state_dict() returned, unedited",
                )
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (checked by ``check_state`` first)."""
        self.check_state(state)
        self._generator.set_state(state["generator"])
        warm = state["warm_start"]
        self._previous = None if warm is None else warm.to(torch.float64)
        self._last = None
        self._prepared = None
        self._used = True

    def _preconditioner(
        self, system: LinearSystem, scaling: str, d: torch.Tensor
    ) -> Preconditioner:
        """The step's preconditioner; drawing the step's curvature subsample first (once
        per system: every attempt of a step solves with the same operator)."""
        if self._prepared is not None and self._prepared[0] is system.a:
            if self._prepared[1] == scaling:
                return self._prepared[2]
        else:
            self._draw(system)
        opts = self.options
        op = system.a
        block = op.block if isinstance(op, GaussNewtonOperator) else _rows_of(op)
        estimate = system.scale("marquardt", scaling_diagonal_torch)
        built = PRECONDITIONERS[opts.preconditioner](block, estimate, d, opts.rank, self._generator)
        self._prepared = (system.a, scaling, built)
        return built

    def _draw(self, system: LinearSystem) -> None:
        """The step's curvature subsample (``solve.curvature``), where the operator has one."""
        self._used = True
        op = system.a
        if not isinstance(op, GaussNewtonOperator) or op.products.samples < 1:
            return
        opts = self.options
        samples = op.products.samples
        size = curvature_size(
            opts.curvature_samples,
            samples,
            opts.iterations + opts.rank,
            op.products.explicit_samples,
        )
        op.products.use_samples(draw_samples(samples, size, self._generator))

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution:
        """δ ≈ (A + λD)⁻¹g by truncated PCG; the solution's ``iterations`` and ``stop``
        say how it ended. Never raises for a numerically bad system: a non-finite
        iterate is ``FAILED_NON_FINITE``, curvature ≤ 0 before any move ``FAILED_CURVATURE``."""
        opts = self.options
        op: Callable[[torch.Tensor], torch.Tensor] = system.a
        g = system.g
        lam = float(damping)
        if system.rows < system.params:
            scaling = "identity"  # the dense under-determined step's D (module docstring)
        d = system.scale(scaling, scaling_diagonal_torch)
        precondition = self._preconditioner(system, scaling, d)
        x = torch.zeros_like(g)
        ax = torch.zeros_like(g)
        r = g.clone()
        if opts.warm_start > 0.0 and self._previous is not None and self._previous.shape == g.shape:
            x0 = opts.warm_start * self._previous.to(g.device)
            ax0 = op(x0)
            bx0 = ax0 + lam * d * x0
            # q(x₀) = ½x₀ᵀBx₀ − gᵀx₀ < 0: a better start than 0.
            if float(0.5 * (x0 @ bx0) - g @ x0) < 0.0:
                x, ax, r = x0, ax0, g - bx0
        g_norm = float(g.norm())
        if not math.isfinite(g_norm):
            return self._finish(x, ax, g, lam, 0, "non-finite", FAILED_NON_FINITE)
        goal = opts.tolerance * g_norm
        z = precondition.apply(r, lam)
        p = z.clone()
        rz = float(r @ z)
        done = 0
        stop = "budget"
        status = 0.0
        for _ in range(opts.iterations):
            if float(r.norm()) <= goal:
                stop = "tolerance"
                break
            ap = op(p)
            bp = ap + lam * d * p
            curvature = float(p @ bp)
            done += 1
            if not math.isfinite(curvature):
                stop, status = "non-finite", FAILED_NON_FINITE
                break
            if curvature <= 0.0:
                # Steihaug's exit without a trust region: keep the last iterate.
                stop = "curvature"
                if not bool(x.any()):
                    status = FAILED_CURVATURE
                break
            alpha = rz / curvature
            x = x.add(p, alpha=alpha)
            ax = ax.add(ap, alpha=alpha)
            r = r.sub(bp, alpha=alpha)
            z = precondition.apply(r, lam)
            rz_next = float(r @ z)
            p = z.add(p, alpha=rz_next / rz) if rz != 0.0 else z.clone()
            rz = rz_next
        else:
            if float(r.norm()) <= goal:
                stop = "tolerance"
        return self._finish(x, ax, g, lam, done, stop, status)

    def _finish(
        self,
        x: torch.Tensor,
        ax: torch.Tensor,
        g: torch.Tensor,
        lam: float,
        iterations: int,
        stop: str,
        status: float,
    ) -> Solution:
        gradient_dot = float(x @ g)
        curvature = float(x @ ax)
        if status == 0.0 and not (math.isfinite(gradient_dot) and math.isfinite(curvature)):
            status, stop = FAILED_NON_FINITE, "non-finite"
        self._last = x if status == 0.0 else None
        return Solution(
            delta=x,
            gradient_dot=gradient_dot,
            curvature=curvature,
            damping=lam,
            status=status,
            iterations=iterations,
            stop=stop,
        )


def _rows_of(op: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A block product (rows of V ↦ rows of AV) from a product of one vector."""
    return lambda vs: torch.stack([op(v) for v in vs])


def _make(parts: SolverParts) -> LinearSolver:
    return parts.cg


#: Conjugate gradients in the registry of solvers: the solve of matrix-free steps.
KIND = SolverKind("cg", ("matrix_free",), _make)
