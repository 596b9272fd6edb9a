"""Geodesic acceleration of an LM step (Transtrum & Sethna 2012): `GeodesicAcceleration`.

The damped step δ of (A + λD) δ = g moves θ along v = −lr·δ, the first-order ("velocity")
term of a path on the model manifold. Transtrum & Sethna ("Improvements to the
Levenberg-Marquardt algorithm for nonlinear least-squares minimization", 2012) add the
second-order term: with r_vv the second directional derivative of the residuals along v,
estimated by one extra residual evaluation

    r_vv ≈ (2/h)·[(r(θ + h·v) − r(θ))/h − J·v]        (h = ``STEP``),

the acceleration a = −(JᵀJ + λD)⁻¹ Jᵀ r_vv solves the same damped system with Jᵀr_vv in
place of Jᵀr (in the under-determined form, (JJᵀ/N + λI) u = r_vv/N and a = −Jᵀu), and
the trial point is θ + v + ½a. Where the acceleration is large next to the velocity,
2‖a‖_D / ‖v‖_D > α (norms weighted by the scaling D), the second-order expansion is not
to be trusted. Transtrum rejects the attempt then and raises λ (``reject=True``); by
default the plain step θ + v is tried instead, which on the NIST problems took no more
steps than plain LM on the easy ones, where rejecting took up to 5 more (docs/
algorithm.md, "Poor starts"). The predicted reduction that the damping rule compares
with stays the velocity's.

Cost per attempt: one forward at θ + h·v, one Jacobian pass at θ (its slices stream; J
is never held whole, except that a J of at most ``KEEP_BYTES`` is kept for the step's
later attempts, θ being the same) and one more damped solve. Not for ``process_group`` or
``params_per_step`` LMAs (refused when they are built).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np
import torch

from marquardt.jacobian import JacobianEngine, PreparedBatch, ResidualNotFiniteError

from .._backends.base import ArrayBackend, LinearSystem, Solution
from .._backends.scaling import scaling_diagonal_numpy
from .._backends.systems import host_vector, read_values

__all__ = ["STEP", "GeodesicAcceleration"]

#: h of the finite-difference estimate of r_vv (Transtrum & Sethna 2012 use 0.1).
STEP = 0.1
#: The largest J (bytes) kept from a step's first attempt for its later ones.
KEEP_BYTES = 64 * 2**20


def _native(vector: torch.Tensor, like: Any) -> Any:
    """``vector`` (float64) as an array of the kind and device of ``like``."""
    if isinstance(like, torch.Tensor):
        return vector.to(like.device, torch.float64)
    return np.asarray(vector.detach().cpu().numpy())


@dataclass(eq=False)
class GeodesicAcceleration:
    """The second-order correction of the attempts of one step (module docstring).

    Built per step with the step's system and prepared batch; called by ``run_attempts``
    with each attempt's solution and λ, it returns the solution whose δ includes the
    correction (or the solution unchanged, or with ``reject`` the reason the attempt is
    rejected), with θ back where it was.

    Arguments:
        alpha: α, the largest 2‖a‖_D / ‖v‖_D trusted.
        reject: whether an attempt whose acceleration is too large is rejected (else its
            plain step is tried).
        engine: the Jacobian engine (its replicas are moved to θ + h·v and back).
        batch: the step's prepared batch.
        backend: the array backend that solves the second damped system.
        system: the step's assembled system.
        scaling: the name of the scaling D.
        learning_rate: the factor of every step δ.
    """

    alpha: float
    _: KW_ONLY
    reject: bool
    engine: JacobianEngine
    batch: PreparedBatch
    backend: ArrayBackend
    system: LinearSystem
    scaling: str
    learning_rate: float
    #: How many attempts of this step took the correction, and how many dropped it.
    taken: int = field(default=0, init=False)
    dropped: int = field(default=0, init=False)
    _weights: np.ndarray[Any, np.dtype[np.float64]] | None = field(default=None, init=False)
    #: The step's (start, J, r) slices, kept from its first attempt when small.
    _pieces: list[tuple[int, torch.Tensor, torch.Tensor]] | None = field(default=None, init=False)

    def _scaled_norm(self, vector: torch.Tensor) -> float:
        if self._weights is None:
            diag = host_vector(self.system.diag)
            scaling = "identity" if self.system.underdetermined else self.scaling
            self._weights = np.sqrt(scaling_diagonal_numpy(diag, scaling))
        return float(np.linalg.norm(self._weights * vector.detach().cpu().double().numpy()))

    def _second_derivative_terms(self, velocity: torch.Tensor) -> torch.Tensor | None:
        """Jᵀr_vv (over-determined) or r_vv (under-determined), float64 on the CPU; None
        when the residuals at θ + h·v are not finite (no acceleration can be estimated)."""
        h = STEP
        batch = self.batch
        if batch.strategy != "explicit":
            # J's slices are streamed, never summed: plan them once for this step.
            batch = self.batch = self.engine.prepare(
                batch.inputs, batch.targets, batch.slice_samples, strategy="explicit", checked=True
            )
        try:
            # Inside the try: an interrupt landing just after the move still restores θ.
            self.engine.replicas.add_(velocity, alpha=h, check=False)
            with torch.no_grad():
                ahead = self.engine.residuals(batch.inputs, batch.targets).reshape(-1)
        except ResidualNotFiniteError:
            return None
        finally:
            self.engine.replicas.restore()
        parts: list[torch.Tensor] = []
        total = torch.zeros(velocity.numel(), dtype=torch.float64)
        for start, jac, here in self._slices(batch):
            v = velocity.to(jac.device, jac.dtype)
            stop = start + int(here.numel())
            rvv = (2.0 / h) * ((ahead[start:stop].to(here) - here) / h - jac @ v)
            if self.system.underdetermined:
                parts.append(rvv.to("cpu", torch.float64))
            else:
                total += (jac.T @ rvv).to("cpu", torch.float64)
        return torch.cat(parts) if self.system.underdetermined else total

    def _slices(self, batch: PreparedBatch) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """``(start, J, r)`` of the step's slices at θ: the kept ones, or streamed (and kept
        while their bytes stay within ``KEEP_BYTES``)."""
        if self._pieces is not None:
            yield from self._pieces
            return
        kept: list[tuple[int, torch.Tensor, torch.Tensor]] | None = []
        size = 0
        for piece in self.engine.jacobian_slices(batch):
            item = (piece.start, piece.jacobian.detach(), piece.residuals.detach().reshape(-1))
            size += item[1].numel() * item[1].element_size()
            if kept is not None:
                kept = [*kept, item] if size <= KEEP_BYTES else None
            yield item
        self._pieces = kept

    def __call__(self, solution: Solution, damping: float) -> Solution | str:
        status, finite = read_values([solution.status, solution.delta.norm()])
        if status != 0.0 or not math.isfinite(finite):
            return solution  # rejected by the attempt loop as it is
        velocity = (-self.learning_rate) * solution.delta.detach()
        terms = self._second_derivative_terms(velocity)
        if terms is None or not bool(torch.isfinite(terms).all()):
            self.dropped += 1
            return solution
        system = self.system
        g = _native(terms / system.rows, system.g)
        # The same damped system with Jᵀr_vv/N (or r_vv/N) in place of Jᵀr/N (or r/N).
        gradient = system.gradient if system.underdetermined else None
        second = dataclasses.replace(system, g=g, gradient=gradient)
        solved = self.backend.solve(second, damping, self.scaling)
        if solved is None:
            self.dropped += 1
            return solution
        (accel_status,) = read_values([solved.status])
        # a = −(A + λD)⁻¹ Jᵀr_vv/N; the trial point θ + v + ½a is θ − lr·(δ + (δ_a/(2·lr))).
        accel = -solved.delta.detach().to(velocity)
        ratio = 2.0 * self._scaled_norm(accel) / max(self._scaled_norm(velocity), 1e-300)
        if accel_status != 0.0 or not math.isfinite(ratio) or ratio > self.alpha:
            self.dropped += 1
            if self.reject and accel_status == 0.0:
                return f"geodesic acceleration too large (2‖a‖/‖v‖ = {ratio:.3g} > {self.alpha:g})"
            return solution
        self.taken += 1
        delta = solution.delta - (0.5 / self.learning_rate) * accel.to(solution.delta)
        return dataclasses.replace(solution, delta=delta)
