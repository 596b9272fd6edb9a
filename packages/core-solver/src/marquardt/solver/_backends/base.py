"""The array-backend protocol: where the damped normal equations are assembled and solved.

One Levenberg-Marquardt step (Marquardt 1963; Nielsen 1999; Gavin's LM notes) solves, for a
residual vector r (N rows) with Jacobian J (N × P),

* over-determined (N ≥ P):   (JᵀJ/N + λD) δ = Jᵀr/N,
* under-determined (N < P):  (JJᵀ/N + λI) u = r/N,   δ = Jᵀu,

where D is I ("identity" scaling) or diag(JᵀJ)/N clamped away from zero ("marquardt"
scaling, Moré 1978). The parameters then move by −learning_rate·δ.

A backend turns the Jacobian package's output (``NormalProducts`` for strategy "accumulate",
``JacobianSlice`` for strategy "explicit") into a ``LinearSystem`` of backend-native
arrays, once per step, and then solves it for as many damping values as the step needs: a
rejected attempt reuses the assembled system and only redoes the damped solve. The
factorisation is a Cholesky factorisation in float64 whatever the assembly dtype, because
at P × P it is cheap and float32 Cholesky of JᵀJ fails often on ill-conditioned networks.

The quadratic model behind the gain ratio (Nielsen 1999) is, in mean-squared-residual
units, for a step s = lr·δ:

    L(p) − L(p − s) ≈ (2 sᵀJᵀr − sᵀJᵀJ s)/N = 2·lr·δᵀg − lr²·δᵀAδ,   g = Jᵀr/N, A = JᵀJ/N,

so a ``Solution`` carries the two scalars δᵀg and δᵀAδ (= ‖Jδ‖²/N) and the caller
applies its learning rate.

The assembly every backend shares (``ArrayOps``, the system from products or from an
explicit J, the quadratic model's terms, host reads) is ``systems.py``.

Implementations: ``numpy_backend.NumpyBackend`` (the CPU reference), ``torch_backend.
TorchBackend`` (everything on the model device), ``cupynumeric_backend`` (Legate; imports
cuPyNumeric lazily). Each backend module exposes a factory

    create_backend(device: torch.device) -> ArrayBackend

(``device`` is the model's device, where the Jacobian products arrive), which is what
``LMA(backend=<name>)`` calls; ``LMA(backend=<instance>)`` takes any object satisfying
``ArrayBackend`` as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from marquardt.jacobian import JacobianSlice, NormalProducts

from .._rules import predicted_reduction
from .scaling import SCALINGS

__all__ = [
    "FAILED_CHOLESKY",
    "FAILED_NON_FINITE",
    "SCALINGS",
    "ArrayBackend",
    "BackendFactory",
    "JacobianBuffers",
    "LinearSystem",
    "Solution",
    "loss_prediction",
]


@dataclass(eq=False)
class LinearSystem:
    """The assembled, undamped system of one step, in backend-native arrays.

    Over-determined: ``a`` = JᵀJ/N (P × P), ``g`` = Jᵀr/N (P,). Under-determined: ``a`` =
    JJᵀ/N (N × N), ``g`` = r/N (N,), and ``jacobian`` holds J (N × P) so that δ = Jᵀu.
    Arrays may be in the assembly dtype (float32 for a float32 model); ``solve`` factorises
    in float64. Systems compare and hash by identity (a backend may cache per system).

    Arguments:
        a: JᵀJ/N, or JJᵀ/N when under-determined.
        g: Jᵀr/N, or r/N when under-determined.
        diag: diag(JᵀJ)/N (P,) in both cases: the squared column norms of J over N, used
            by Marquardt scaling and by the MINPACK gtol test.
        rows: N, the residual rows.
        params: P, the parameters.
        underdetermined: whether the system is the N × N one (N < P).
        rss: the sum of squared residuals ‖r‖² (the mean squared residual at the current
            parameters is ``rss / rows``).
        jacobian: J (N × P); needed when under-determined, else ``None``.
        gradient: Jᵀr/N (P,) in both cases; ``None`` for an over-determined system makes
            it ``g`` itself (an under-determined system must supply it).
        _scales: the scalings D built so far, by name (see `scale`); callers leave it empty.

    Raises:
        ValueError: an under-determined system without ``jacobian`` or ``gradient``.
    """

    a: Any
    g: Any
    diag: Any
    rows: int
    params: int
    underdetermined: bool
    rss: float
    jacobian: Any | None = None
    gradient: Any | None = None
    _scales: dict[str, Any] = field(default_factory=dict, repr=False)

    def scale(self, scaling: str, build: Callable[[Any, str], Any]) -> Any:
        """D for ``scaling``, built on the first attempt of the step and then reused.

        Arguments:
            scaling: the scaling's name (``"identity"``, ``"marquardt"``).
            build: ``build(diag, scaling)`` makes D; called once per system and scaling
                (the system does not change between attempts).

        Returns:
            D, as ``build`` made it.
        """
        held = self._scales.get(scaling)
        if held is None:
            held = self._scales[scaling] = build(self.diag, scaling)
        return held

    def __post_init__(self) -> None:
        if self.gradient is None and not self.underdetermined:
            self.gradient = self.g
        if self.underdetermined and (self.jacobian is None or self.gradient is None):
            raise ValueError(
                "an under-determined LinearSystem needs `jacobian` (J, N×P) for δ = Jᵀu and "
                "`gradient` (Jᵀr/N); one of them is None. HINT: the backend must pass both."
            )


#: ``Solution.status`` of a solve whose Cholesky factorisation failed (not positive definite).
FAILED_CHOLESKY = 1.0
#: ``Solution.status`` of a solve whose δ is not finite.
FAILED_NON_FINITE = 2.0


@dataclass(frozen=True)
class Solution:
    """One damped solve: δ and the terms of the quadratic model's predicted reduction.

    A backend on a GPU may leave ``gradient_dot``, ``curvature`` and ``status`` as 0-dim
    tensors on its device, so that a solve never waits for the device: the caller reads
    them together with the trial loss, in one transfer (`read_values`), and a failed
    solve is then rejected like a worse trial point.

    Arguments:
        delta: δ as a float64 torch tensor of shape (P,) on the backend's device (the CPU
            for NumPy and cuPyNumeric, the model's device for torch); the parameters move
            by −learning_rate·δ.
        gradient_dot: δᵀg with g = Jᵀr/N.
        curvature: δᵀ(JᵀJ/N)δ = ‖Jδ‖²/N.
        damping: the λ it was solved with.
        status: 0 for a good solve, ``FAILED_CHOLESKY`` or ``FAILED_NON_FINITE``.
        iterations: a matrix-free solve's conjugate-gradient iterations; ``None`` for a
            factorisation.
        stop: why an iterative solve stopped; ``""`` for a factorisation.
    """

    delta: torch.Tensor
    gradient_dot: float | torch.Tensor
    curvature: float | torch.Tensor
    damping: float
    status: float | torch.Tensor = 0.0
    iterations: int | None = None
    stop: str = ""

    def predicted_reduction(self, learning_rate: float = 1.0) -> float:
        """The mean-squared-residual reduction the linear model predicts for a step lr·δ.

        Arguments:
            learning_rate: lr.

        Returns:
            2·lr·δᵀg − lr²·δᵀAδ (`loss_prediction`).
        """
        return float(
            loss_prediction(float(self.gradient_dot), float(self.curvature), learning_rate)
        )


def loss_prediction(gradient_dot: Any, curvature: Any, learning_rate: float) -> Any:
    """The quadratic model's reduction of the mean squared residual for a step lr·δ.

    (‖r‖² − ‖r − lr·Jδ‖²)/N = 2·lr·δᵀg − lr²·δᵀAδ (Nielsen 1999, eq. 2.3): the cost's
    prediction of ``_rules.predicted_reduction`` (the one formula, in units of
    C = ½‖r‖²) for s = −lr·δ, times 2/N, with g = Jᵀr/N and A = JᵀJ/N.

    Arguments:
        gradient_dot: δᵀg (a float or a 0-dim tensor).
        curvature: δᵀAδ.
        learning_rate: lr.

    Returns:
        The predicted reduction, of the kind given.
    """
    lr = learning_rate
    return 2.0 * predicted_reduction(0.0, -lr * gradient_dot, (lr * lr) * curvature)


@runtime_checkable
class ArrayBackend(Protocol):
    """Where the LM linear algebra runs: assembly of the normal equations and damped solves.

    The Jacobian's products arrive as torch tensors on a model device; a slice's buffers
    are never reused by their producer, so a backend may attach them without copying.
    ``solve`` never raises for a numerically bad system: a ``None`` is a rejected attempt
    and the caller raises λ. ``synchronize`` blocks until the backend's queued work is
    done (for honest timing).

    Attributes:
        name: the backend's name in reports (``"numpy"``, ``"torch"``, ``"cupynumeric"``).
    """

    name: str

    def system_from_products(self, products: NormalProducts) -> LinearSystem:
        """The over-determined system from accumulated normal products.

        Arguments:
            products: JᵀJ, Jᵀr and ‖r‖² summed on a model device.

        Returns:
            A = JᵀJ/N, g = Jᵀr/N in this backend's arrays.
        """
        ...

    def system_from_slices(
        self, slices: Iterable[JacobianSlice], rows: int, params: int
    ) -> LinearSystem:
        """The system (over- or under-determined by rows vs params) from Jacobian slices.

        Arguments:
            slices: the row slices of J and r, every row 0..rows exactly once, any order.
            rows: N, the rows of J.
            params: P, the columns of J.

        Returns:
            The over-determined system when ``rows ≥ params``, else the under-determined
            one (JJᵀ/N, r/N, with J kept for δ = Jᵀu).
        """
        ...

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        """δ for damping λ, from the float64 Cholesky factorisation of (A + λD).

        Arguments:
            system: the step's assembled system.
            damping: λ.
            scaling: D: ``"identity"`` (I) or ``"marquardt"`` (diag clamped away from 0);
                the under-determined system always uses I.

        Returns:
            The [`Solution`][marquardt.solver.Solution], or ``None`` when the
            factorisation fails or δ is not finite.
        """
        ...

    def synchronize(self) -> None:
        """Block until all queued work of this backend is finished."""
        ...


class BackendFactory(Protocol):
    """The ``create_backend(device)`` function every backend module exposes."""

    def __call__(self, device: torch.device) -> ArrayBackend: ...


@runtime_checkable
class JacobianBuffers(Protocol):
    """A backend that lets the Jacobian engine write J and r straight into its arrays.

    ``jacobian_buffers`` returns torch tensors (R × P in ``dtype``, and R) that are views
    of the arrays the backend will solve with; ``system_from_jacobian`` builds the system
    from them once they are filled. No slice is copied a second time.
    """

    def jacobian_buffers(
        self, rows: int, params: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Empty J (rows × params) and r (rows,) for the engine to fill."""
        ...

    def system_from_jacobian(self, jacobian: torch.Tensor, residuals: torch.Tensor) -> LinearSystem:
        """The system from the filled buffers."""
        ...
