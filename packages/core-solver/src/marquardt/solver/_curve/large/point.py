"""Passes over the data at given parameters: J's factor, the Gauss-Newton step, the cost.

At p, J = ∂r/∂p (with respect to p itself, not the internal variables of the bounds'
transform) and r are reduced at once to the triangular factor of [a·J | (ρ'/a)·r] (a = 1
for the linear loss; SciPy's √max(ρ' + 2ρ''z, ε) for a robust one, as
``scipy.optimize.least_squares`` scales its rows, Triggs et al. 2000 §4.3):

    [a·J | (ρ'/a)·r] = Q [[R, q], [0, ·]],

so RᵀR = JᵀJ (for the covariance, ``_lm.covariance``), Rᵀq = ∇C (the gradient of the cost),
and δ = R⁻¹q is the Gauss-Newton step (for a robust loss, with the second-order
correction). The factor comes from the Gram matrix of [a·J | (ρ'/a)·r] while its scaled
columns are well conditioned (``GRAM_CONDITION``), else from a QR of every slice.
``polish`` uses it to remove the last digits LM leaves (see there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from marquardt.jacobian import JacobianEngine, Replicas

from ..._lm.covariance import GramFactor, TriangularFactor, factor_from_gram
from ..._lm.robust import rho, scipy_row_scale
from .inputs import CurveInputs
from .model import CurveModel, weighted_residuals

__all__ = [
    "CONTRACTION",
    "CONVERGED",
    "GRAM_CONDITION",
    "PASS_SLICE",
    "REFINE_LIMIT",
    "REFINE_STEPS",
    "REUSE_LIMIT",
    "ROUNDING",
    "AtPoint",
    "PointPasses",
    "Polished",
    "Residuals",
    "polish",
    "refined",
]

#: The largest Gauss-Newton correction applied after LM, relative to each parameter.
REFINE_LIMIT = 1e-6
#: A correction this small relative to each parameter is rounding: none is applied.
ROUNDING = 4 * torch.finfo(torch.float64).eps
#: At most this many such corrections (each one pass over the data), while each is
#: smaller than the one before.
REFINE_STEPS = 8
#: Gauss-Newton converges linearly where the residuals are not small, at a rate set by
#: their curvature; at a hand-over, a step larger than this fraction of the one before is
#: not converging fast enough to leave LM for (``polish``).
CONTRACTION = 0.5
#: A correction this small relative to each parameter moves J by less than the
#: covariance's own accuracy needs: J's factor is kept and only r is evaluated anew.
REUSE_LIMIT = 1e-9
#: The largest condition number of J's scaled columns (with r) for which its factor is
#: taken from the Gram matrix (``PointPasses.at``).
GRAM_CONDITION = 1e4
#: Gauss-Newton steps that shrink by this factor or more from one to the next converge
#: fast enough for the last one to leave rounding only (``polish``).
CONVERGED = 1e-3
#: Samples per slice of that pass when the caller gives no slice size: a slice's J and
#: its QR stay in cache (2¹⁶ float64 rows of P + 1 columns), and J is never held whole.
PASS_SLICE = 1 << 16


@dataclass(frozen=True)
class AtPoint:
    """One pass over the data at ``params``: the factor [[R, q], [0, ·]], the residuals
    (None when the pass formed JᵀJ, Jᵀr and rᵀr without keeping r: ``PointPasses.at``)
    r = (f − y)/σ (CPU, float64), their number and the cost C = ½ Σ c²ρ(z)."""

    params: torch.Tensor
    augmented: torch.Tensor
    rows: int
    residuals: torch.Tensor | None
    cost: float

    @property
    def factor(self) -> torch.Tensor:
        """R, with RᵀR = JᵀJ (J's rows scaled as SciPy scales them)."""
        return self.augmented[:, : self.params.numel()]

    @property
    def gradient(self) -> torch.Tensor:
        """∇C = Rᵀq."""
        return self.factor.T @ self.augmented[:, self.params.numel()]

    def step(self, free: torch.Tensor) -> torch.Tensor | None:
        """The Gauss-Newton step δ over the ``free`` parameters (zero for the others), or
        None when it is not determined (rank-deficient J) or not finite.

        With the held columns dropped, [R_F | q] is reduced again (a (P+1)-row QR) and
        δ_F = R_F⁻¹ q_F.
        """
        count = self.params.numel()
        columns = torch.cat([free.cpu(), torch.tensor([True])])
        reduced = torch.linalg.qr(self.augmented[:, columns], mode="r").R
        kept = int(free.sum())
        if reduced.shape[0] < kept or kept == 0:
            return None
        top = reduced[:kept]
        delta = torch.linalg.solve_triangular(top[:, :kept], top[:, kept:], upper=True)
        if not bool(torch.isfinite(delta).all()):
            return None
        full = torch.zeros(count, dtype=torch.float64)
        full[free.cpu()] = delta.reshape(-1)
        return full


class PointPasses:
    """Passes over the data at given parameters p, with one model and one Jacobian engine
    (planned and checked once) for every point asked: `at` (J's factor, r and the
    cost) and `residuals` (r and the cost alone)."""

    def __init__(
        self,
        f: Callable[..., torch.Tensor],
        data: CurveInputs,
        *,
        loss: str,
        f_scale: float,
        slice_size: int | None,
    ) -> None:
        self.data, self.loss, self.f_scale = data, loss, f_scale
        start = data.p0.to(data.device, data.dtype)
        everything = torch.ones(start.numel(), dtype=torch.bool, device=data.device)
        self.model = CurveModel(
            f, start, bounds=None, held=start, free=everything, samples_last=data.samples_last
        )
        self.engine = JacobianEngine(
            Replicas(self.model, [data.device]), weighted_residuals, mode="broadcast"
        )
        # Without a slice size, slices of one cache-sized chunk: J is never held whole.
        self.size = slice_size or min(data.samples, PASS_SLICE)
        self.slice_size = slice_size

    def _cost(self, residuals: torch.Tensor) -> float:
        value, _, _ = rho(self.loss, (residuals / self.f_scale) ** 2)
        return 0.5 * float(self.f_scale * self.f_scale * value.sum())

    def at(self, params: torch.Tensor) -> AtPoint:
        """J with respect to p itself (not the internal q) and r, reduced slice by slice.

        [a·J | (ρ'/a)·r] is reduced to its triangular factor [[R, q], [0, ·]] (a = 1 for
        the linear loss; SciPy's √max(ρ' + 2ρ''z, ε) for a robust one,
        ``scipy_row_scale``): R is the factor of J for the covariance, as
        ``scipy.optimize.curve_fit`` forms it, and δ = R⁻¹q is the Gauss-Newton step (for
        a robust loss with the second-order correction). The factor comes from the Gram
        matrix when the scaled columns' condition number is at most ``GRAM_CONDITION``
        (ε·κ² ≤ 2·10⁻⁸: well within what the covariance needs); otherwise the pass is
        made again with a QR of every slice (``TriangularFactor``).
        """
        self.engine.replicas.set_flat_params(params.to(self.data.device, self.data.dtype))
        if self.loss == "linear":
            # The LM step's own products (JᵀJ, Jᵀr, rᵀr: the Gram matrix of [J | r]), with
            # its reused workspaces; r itself is not kept (``polish`` evaluates it at the
            # end, with a forward pass).
            batch = self.engine.prepare(
                self.data.x,
                self.data.targets,
                self.slice_size,
                strategy="accumulate",
                checked=True,
            )
            products = self.engine.normal_products(batch, dtype=torch.float64)
            count = int(products.jtr.numel())
            matrix = torch.empty(count + 1, count + 1, dtype=torch.float64)
            matrix[:count, :count] = products.jtj.to("cpu", torch.float64)
            matrix[:count, count] = matrix[count, :count] = products.jtr.to("cpu", torch.float64)
            matrix[count, count] = products.rss
            factor = factor_from_gram(matrix, GRAM_CONDITION)
            if factor is not None:
                return AtPoint(params, factor, products.rows, None, 0.5 * products.rss)
        gram = GramFactor()
        residuals = self._pass(gram.add)
        factor = gram.factor(GRAM_CONDITION)
        if factor is None:
            reduced = TriangularFactor()
            self._pass(lambda rows: reduced.add(rows.t()))
            factor = reduced.factor
        assert factor is not None  # the batch is not empty (checked)
        return AtPoint(params, factor, gram.rows, residuals, self._cost(residuals))

    def _pass(self, reduce: Callable[[torch.Tensor], None]) -> torch.Tensor:
        """One pass: each slice's [a·J | (ρ'/a)·r], as its (P+1) × b rows, to ``reduce``;
        returns r (CPU, float64)."""
        data, loss, f_scale = self.data, self.loss, self.f_scale
        pieces: list[torch.Tensor] = []
        # The data were checked by check_curve_inputs: no second scan for NaN/inf.
        batch = self.engine.prepare(
            data.x, data.targets, self.size, strategy="explicit", checked=True
        )
        for piece in self.engine.jacobian_slices(batch):
            r = piece.residuals.to(torch.float64)
            jac = piece.jacobian.to(torch.float64)
            pieces.append(r.cpu())
            if loss != "linear":
                _, first, _ = rho(loss, (r / f_scale) ** 2)
                a = scipy_row_scale(r, loss, f_scale)
                jac, r = jac * a.unsqueeze(1), r * (first / a)
            # [J | r] as its (P+1) × b rows: their transpose is column-major, the layout a
            # QR wants, and the Gram matrix is one product of them with their transpose.
            reduce(torch.cat([jac.t(), r.unsqueeze(0)]))
        return torch.cat(pieces)

    def residuals(self, params: torch.Tensor) -> Residuals:
        """r and the cost at ``params``: forward passes only, slice by slice (no J)."""
        data = self.data
        self.engine.replicas.set_flat_params(params.to(data.device, data.dtype))
        pieces = []
        with torch.no_grad():
            for lo in range(0, data.samples, self.size):
                out = self.model(data.x[lo : lo + self.size])
                r = weighted_residuals(out, data.targets[lo : lo + self.size])
                pieces.append(r.to("cpu", torch.float64))
        residuals = torch.cat(pieces)
        return Residuals(params, residuals, self._cost(residuals))


@dataclass(frozen=True)
class Residuals:
    """r = (f − y)/σ at ``params`` (CPU, float64) and the cost C = ½ Σ c²ρ(z) there."""

    params: torch.Tensor
    residuals: torch.Tensor
    cost: float


def _final(passes: PointPasses, point: AtPoint) -> Residuals:
    """r and the cost at ``point`` (a forward pass when the point did not keep r)."""
    if point.residuals is None:
        return passes.residuals(point.params)
    return Residuals(point.params, point.residuals, point.cost)


def refined(
    point: AtPoint, lower: torch.Tensor, upper: torch.Tensor, free: torch.Tensor
) -> tuple[torch.Tensor | None, bool]:
    """(p − δ, False) when the Gauss-Newton step over the ``free`` parameters is a
    last-digits correction that stays within the bounds; (None, True) when δ is within
    rounding of p already (another pass would change nothing); else (None, False).

    LM accepts a step only when the cost falls by more than its rounding error, which
    leaves p̂ up to about √ε·(standard error) from the optimum; a Gauss-Newton step from
    the QR factor of J is accurate to about ε·κ(J) and removes that (up to
    ``REFINE_STEPS`` of them, while each is that small and stays within the bounds).
    """
    step = point.step(free)
    if step is None:
        return None, False
    p = point.params
    if not bool((step.abs() <= REFINE_LIMIT * p.abs()).all()):
        return None, False
    if bool((step.abs() <= ROUNDING * p.abs()).all()):
        return None, True
    moved = p - step
    if bool(((moved < lower) | (moved > upper)).any()):
        return None, False
    return moved, False


@dataclass(frozen=True)
class Polished:
    """The passes after LM: ``point`` (J's factor for the covariance), ``final`` (popt, its
    residuals and cost) and whether Gauss-Newton steps reached rounding (``finished``: the
    last step was within rounding, or a last-digits step checked by a forward pass)."""

    point: AtPoint
    final: Residuals
    finished: bool


def _relative(step: torch.Tensor, p: torch.Tensor) -> float:
    """max_j |δ_j| / |p_j| (inf where p_j = 0 and δ_j ≠ 0)."""
    return float((step.abs() / p.abs()).nan_to_num(nan=0.0).max())


def polish(
    passes: PointPasses,
    params: torch.Tensor,
    lower: torch.Tensor,
    upper: torch.Tensor,
    free: torch.Tensor,
    *,
    handing_over: bool = False,
) -> Polished:
    """J's factor at ``params`` and up to ``REFINE_STEPS`` last-digits corrections, each
    smaller than the one before (``handing_over``: at most ``CONTRACTION`` of it, so that a
    hand-over Gauss-Newton cannot finish costs few passes before LM goes on).

    From the second correction on, one of at most ``REUSE_LIMIT`` relative over data of
    more than one slice is checked with a forward pass alone and J's factor is kept (it
    moves by about as much as p does). One slice: J is cheap, and the loop goes on.

    ``finished`` says that what is left is rounding: the last step was within rounding; or
    the last step taken was below ``REUSE_LIMIT·CONVERGED``; or the forward-checked one
    was at most ``CONVERGED`` of the step before it (the next one is then below
    ``REUSE_LIMIT·CONVERGED``); or, after ``REFINE_STEPS``, the next step (from the factor
    at hand, no pass) is below that. Otherwise (Gauss-Newton contracting slowly or not at
    all, a step too large or leaving the bounds) the caller's LM may go on.
    """
    point = passes.at(params)
    previous = float("inf")
    for _ in range(REFINE_STEPS):
        moved, at_rounding = refined(point, lower, upper, free)
        if moved is None:
            return Polished(point, _final(passes, point), at_rounding)
        size = _relative(moved - point.params, point.params)
        if size > (CONTRACTION if handing_over else 1.0) * previous:
            return Polished(point, _final(passes, point), False)
        if size <= REUSE_LIMIT and previous < float("inf") and passes.data.samples > PASS_SLICE:
            last = passes.residuals(moved)
            # The step corrects the last digits; a cost above rounding means it did not.
            if not last.cost <= point.cost * (1.0 + 1e-12):
                return Polished(point, _final(passes, point), False)
            return Polished(point, last, size <= CONVERGED * previous)
        better = passes.at(moved)
        if not better.cost <= point.cost * (1.0 + 1e-12):
            return Polished(point, _final(passes, point), False)
        point, previous = better, size
        if size <= REUSE_LIMIT * CONVERGED:
            return Polished(point, _final(passes, point), True)
    step = point.step(free)
    left = float("inf") if step is None else _relative(step, point.params)
    return Polished(point, _final(passes, point), left <= REUSE_LIMIT * CONVERGED)
