"""How long one LM step takes, by strategy: `step_seconds`.

Work over rates (`MachineConstants`), for ``R`` residual rows, ``P`` parameters, ``b``
bytes per element. A forward pass of a network costs about ``2·R·P`` flops (each
parameter is one multiply-add per row), a reverse pass twice that. Every strategy pays
the forward that starts the step and ``TRIAL_FORWARDS`` trial forwards (``2·R·P`` each);
besides:

* accumulate (``R ≥ P``): the Jacobian (a forward and a reverse pass per row, ``6·R·P``,
  and ``J``'s ``R·P·b`` bytes written and read), the Gram product ``2·R·P²`` and
  ``ATTEMPTS`` Cholesky factorisations of ``P³/3`` flops (float64), with the ``P × P``
  matrix copied for each (``3·8·P²`` bytes);
* explicit (``R < P``): the same Jacobian, ``JJᵀ`` for ``2·R²·P`` and ``ATTEMPTS``
  factorisations of ``R³/3``, with ``δ = Jᵀu`` (``2·R·P``) per attempt;
* matrix_free: the gradient pass (``6·R·P``) and the diagonal probes (``4·R·P`` each),
  then ``MATRIX_FREE_PRODUCTS`` Gauss-Newton products over the whole batch's worth of rows
  (the CG budget and the Nyström sketch on the curvature subsample: about two of them,
  plus the warm start's and a rejected attempt's), ``10·R·P`` each (a ``jvp``: the forward
  and its tangent, ``4·R·P``; a ``vjp``: the forward again and the reverse, ``6·R·P``),
  and ``MATRIX_FREE_VECTORS`` P-vectors of float64 traffic per product.

The model is coarse (tens of percent), but strategies differ by orders of magnitude where
the choice matters: a ``P³`` or ``R²·P`` step of minutes against products of seconds. A
dense step solves the damped system exactly, a matrix-free one truncates it on a
curvature subsample: `prefers_matrix_free` takes the matrix-free step only where the
dense one is slow (``SLOW_STEP`` seconds or more) and predicted ``DENSE_STEP_WORTH`` times
slower.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._machine import MachineConstants

__all__ = [
    "ATTEMPTS",
    "DENSE_STEP_WORTH",
    "MATRIX_FREE_PRODUCTS",
    "MATRIX_FREE_VECTORS",
    "PROBES",
    "SLOW_STEP",
    "TRIAL_FORWARDS",
    "StepTime",
    "prefers_matrix_free",
    "step_seconds",
]

#: How many matrix-free steps one dense step is worth (exact against truncated solves).
DENSE_STEP_WORTH = 10.0
#: A dense step predicted to take at least this many seconds is a slow one.
SLOW_STEP = 30.0

#: Damped attempts a dense step is counted with (factorisations).
ATTEMPTS = 2
#: Trial forwards a step is counted with (one per attempt).
TRIAL_FORWARDS = 2
#: Gauss-Newton products over the whole batch's rows a matrix-free step is counted with.
MATRIX_FREE_PRODUCTS = 4
#: Diagonal probes of a matrix-free step (``TruncatedCG.probes``' default).
PROBES = 1
#: Float64 P-vectors a matrix-free product reads and writes (CG's vectors and the sketch).
MATRIX_FREE_VECTORS = 12


@dataclass(frozen=True)
class StepTime:
    """The predicted seconds of one step.

    Arguments:
        strategy: the strategy predicted.
        seconds: the whole step.
        parts: by name (forwards, jacobian, gram, factor, gradient, products), seconds.
    """

    strategy: str
    seconds: float
    parts: dict[str, float]

    def words(self) -> str:
        """The prediction in words.

        Returns:
            ``accumulate ≈ 12.30 s per step (gram 10.10 s, factor 2.00 s, …)``.
        """
        top = sorted(self.parts.items(), key=lambda kv: -kv[1])[:3]
        inner = ", ".join(f"{name} {_secs(value)}" for name, value in top)
        return f"{self.strategy} ≈ {_secs(self.seconds)} per step ({inner})"


def _secs(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    if seconds >= 0.1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.2f} ms"


def step_seconds(
    strategy: str, rows: int, params: int, item: int, machine: MachineConstants
) -> StepTime:
    """The predicted seconds of one step of ``strategy`` (the module docstring's model).

    Arguments:
        strategy: "accumulate", "explicit" or "matrix_free".
        rows: ``R``, the residual rows.
        params: ``P``, the parameters.
        item: ``b``, bytes per element of the Jacobian's dtype.
        machine: the rates.

    Returns:
        The seconds and their parts.

    Raises:
        ValueError: an unknown strategy.
    """
    r, p = float(rows), float(params)
    flops, factor, bw = machine.matmul_flops, machine.factor_flops, machine.bandwidth
    parts = {"forwards": (1 + TRIAL_FORWARDS) * 2 * r * p / flops}
    if strategy in ("accumulate", "explicit"):
        parts["jacobian"] = 6 * r * p / flops + 2 * r * p * item / bw
        if strategy == "accumulate":
            parts["gram"] = 2 * r * p * p / flops
            parts["factor"] = ATTEMPTS * (p**3 / 3 / factor + 3 * 8 * p * p / bw)
        else:
            side = min(r, p)
            parts["gram"] = 2 * side * side * max(r, p) / flops
            parts["factor"] = ATTEMPTS * (side**3 / 3 / factor + 2 * r * p / flops)
    elif strategy == "matrix_free":
        parts["gradient"] = (6 + 4 * PROBES) * r * p / flops
        parts["products"] = MATRIX_FREE_PRODUCTS * (
            10 * r * p / flops + MATRIX_FREE_VECTORS * 8 * p / bw
        )
    else:
        raise ValueError(
            f"strategy={strategy!r} was given; the step-time model knows accumulate, "
            "explicit and matrix_free. HINT: pass one of those"
        )
    return StepTime(strategy, sum(parts.values()), parts)


def prefers_matrix_free(dense: StepTime, free: StepTime) -> bool:
    """Whether the matrix-free step wins: the dense one is slow (``SLOW_STEP``) and
    predicted ``DENSE_STEP_WORTH`` times slower.

    Arguments:
        dense: the dense strategy's predicted step.
        free: the matrix-free strategy's.

    Returns:
        True where the matrix-free step should be taken.
    """
    return dense.seconds >= SLOW_STEP and dense.seconds > DENSE_STEP_WORTH * free.seconds
