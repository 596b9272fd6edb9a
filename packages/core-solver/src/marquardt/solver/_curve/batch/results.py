"""The results of a solved chunk of ``curve_fit_batch``: pcov, χ² and the final status.

pcov follows ``scipy.optimize.curve_fit`` (its ``trf`` branch) for least squares: (JᵀJ)⁻¹
over the fitted parameters, from the Cholesky factor of the equilibrated JᵀJ where that is
trusted, else SciPy's pseudo-inverse from J's SVD (without the singular values below
ε·max(N, P)·s₀), times s² = 2C/(N − P_free) unless ``absolute_sigma``, with N the points
the fit kept. For the Poisson estimator pcov is the inverse of the Fisher information
Σᵢ ∂fᵢ∂fᵢᵀ/fᵢ at p̂ (the Cramér–Rao bound; absolute, never scaled).

A fixed parameter's row and column of pcov are zero. A fitted parameter whose column of J
(for Poisson, of the information's square root or of the LM's curvature) is
numerically zero at p̂, its norm at most
ε^⅔ times the largest fitted column's (``ZERO_COLUMN``), is not determined by the data (an all-zero spot's
position and width): its row and column of pcov are inf, and a fit that had converged gets
the status −1 ("singular", Gpufit's singular-hessian state), as does one that ran out of
evaluations. A fit whose covariance is
undefined otherwise (non-finite J, fewer points than fitted parameters) gets inf throughout.
χ² is Gpufit's: Σr² (weighted) for least squares, the deviance 2Σ[f − y − y·ln(f/y)] for
Poisson, both 2C.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..._errors import CovarianceWarning, OptimizeWarning, user_stacklevel
from ..._rules import covariance_scale, pseudo_inverse_gram
from ..batched_lm import estimators
from ..batched_lm.phases import _residuals, scaled_jacobian
from ..batched_lm.state import (
    STATUS_MESSAGES,
    TOO_FEW_POINTS,
    BatchData,
    BatchModel,
    BatchState,
    InformedState,
)

__all__ = [
    "NON_POSITIVE_MODEL",
    "SINGULAR",
    "ZERO_COLUMN",
    "ChunkResult",
    "chunk_result",
    "warn_results",
]

#: ``traced.gram_inverse`` or its compiled kernel: JᵀJ ↦ ((JᵀJ)⁻¹, trusted).
Inverse = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
#: J̃ (rows scaled) at p̂ of the fits of an index.
Jacobian = Callable[[torch.Tensor], torch.Tensor]

#: The power of ε below which a column's norm, relative to the largest, counts as zero: a
#: zero column is met at the end only to the stopping tests' precision (an all-zero spot's
#: position column stops near 1e-13 of the largest in float64, 1e-9 in float32), and √ε
#: would call the columns of a float32 polynomial in x up to a few hundred zero.
ZERO_COLUMN = 2.0 / 3.0
#: The status of a fit with a parameter its data do not determine.
SINGULAR = -1
#: The status of a Poisson fit whose model is non-positive at a count at the start.
NON_POSITIVE_MODEL = -4


@dataclass(frozen=True)
class ChunkResult:
    """A chunk's final state (statuses settled), pcov (M × P × P) and χ² (M,)."""

    state: BatchState
    pcov: torch.Tensor
    chi_square: torch.Tensor


def _too_few_points(state: BatchState, data: BatchData) -> BatchState:
    """``state`` with the fits that kept fewer points than fitted parameters marked as
    failed (``TOO_FEW_POINTS``, p NaN): their parameters are not determined by their data."""
    if data.mask is None:
        return state
    few = data.mask.sum(1) < _free(state, data).sum(1)
    if not bool(few.any()):
        return state
    return replace(
        state,
        p=torch.where(few[:, None], torch.nan, state.p),
        status=torch.where(few, TOO_FEW_POINTS, state.status),
    )


def _free(state: BatchState, data: BatchData) -> torch.Tensor:
    return torch.ones_like(state.p, dtype=torch.bool) if data.free is None else data.free.bool()


def _unscaled_pseudo_inverse(js: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """(JᵀJ)⁺ per fit from J's SVD (`pseudo_inverse_gram`); inf for a J of zeros."""
    _, s, vh = torch.linalg.svd(js, full_matrices=False)
    out = pseudo_inverse_gram(s, vh, kept, torch.finfo(s.dtype).eps)
    return torch.where((s[:, :1] > 0)[:, :, None], out, torch.inf)


def _unscaled(
    gram: torch.Tensor,
    kept: torch.Tensor,
    inverse: Inverse,
    jacobian: Jacobian,
    used: torch.Tensor,
) -> torch.Tensor:
    """(JᵀJ)⁻¹ over the ``used`` parameters per fit (the others' rows and columns of
    ``gram`` are the identity's): ``inverse``'s where it is trusted, else from J's SVD as
    SciPy forms it, J formed again (``jacobian``, unused columns zeroed) for those fits
    only. The factor costs a fraction of the SVD, which only the fits that need it pay for."""
    out, good = inverse(gram)
    rest = torch.nonzero(~good).reshape(-1)
    if rest.numel():
        js = jacobian(rest) * used[rest][:, None, :]
        js = torch.where(torch.isfinite(js).all(-1).all(-1)[:, None, None], js, 0.0)
        out = out.clone()
        out[rest] = _unscaled_pseudo_inverse(js, kept[rest])
    return out


def _undetermined(gram: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """The fitted parameters whose column of J is numerically zero (module docstring)."""
    norms = torch.sqrt(torch.clamp(torch.diagonal(gram, dim1=-2, dim2=-1), min=0.0))
    norms = torch.where(free, norms, torch.zeros_like(norms))
    cut = torch.finfo(gram.dtype).eps ** ZERO_COLUMN * norms.amax(1, keepdim=True)
    undetermined: torch.Tensor = free & (norms <= cut)
    return undetermined


def _pcov(
    gram: torch.Tensor,
    cost2: torch.Tensor | None,
    kept: torch.Tensor,
    inverse: Inverse,
    jacobian: Jacobian,
    free: torch.Tensor,
    unknown: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pcov, undetermined) per fit (module docstring); ``cost2`` is 2C for a covariance
    scaled by s², None for an absolute one; ``unknown`` marks parameters known to be
    undetermined beforehand."""
    finite = torch.isfinite(gram.sum((1, 2)))
    gram = torch.where(finite[:, None, None], gram, torch.zeros_like(gram))
    unknown = (unknown | _undetermined(gram, free)) & finite[:, None]
    used = free & ~unknown
    pair = used[:, :, None] & used[:, None, :]
    eye = torch.eye(gram.shape[1], dtype=gram.dtype, device=gram.device)
    unscaled = _unscaled(torch.where(pair, gram, eye), kept, inverse, jacobian, used)
    params = free.sum(1).to(gram.dtype)
    bad = ~finite | ~torch.isfinite(torch.where(pair, unscaled, 0.0)).flatten(1).all(1)
    bad |= (kept < params) | ~used.any(1)
    if cost2 is not None:
        # s² = 2C/(N − P_free): the N − P_free spare points over no further parameters.
        scale = covariance_scale(cost2, kept - params, 0)
        unscaled = unscaled * scale[:, None, None]
        bad |= ~torch.isfinite(scale)
    pcov = torch.where(pair, unscaled, 0.0)
    either = (unknown[:, :, None] | unknown[:, None, :]) & free[:, :, None] & free[:, None, :]
    pcov = torch.where(either, torch.inf, pcov)
    return torch.where(bad[:, None, None], torch.inf, pcov), unknown


def chunk_result(
    model: BatchModel,
    state: BatchState,
    data: BatchData,
    absolute_sigma: bool,
    inverse: Inverse,
) -> ChunkResult:
    """A solved chunk's results (module docstring).

    Arguments:
        model: the chunk's model.
        state: its LM state at the end.
        data: its data.
        absolute_sigma: whether σ is absolute (least squares only).
        inverse: ``traced.gram_inverse`` or its compiled kernel.

    Returns:
        The `ChunkResult`.
    """
    state = _too_few_points(state, data)
    free = _free(state, data)
    kept = (
        torch.full((state.p.shape[0],), state.r.shape[1], device=state.p.device)
        if data.mask is None
        else data.mask.sum(1)
    ).to(state.p.dtype)
    if data.estimator == "lse":
        gram, jacobian = state.gram, _lse_jacobian(model, state, data)
        cost2 = None if absolute_sigma else 2.0 * state.cost
        status, unknown = state.status, torch.zeros_like(free)
    else:
        f = state.r + data.y
        gram, jacobian, cost2 = (
            _information(model, state, data),
            _poisson_jacobian(model, state, data),
            None,
        )
        invalid = ~estimators.valid_model(f, data.y).all(1)
        status = torch.where((state.status == -2) & invalid, NON_POSITIVE_MODEL, state.status)
        # Gpufit's curvature Σ (y/f²)∂f∂fᵀ is zero for a spot without counts: singular.
        unknown = _undetermined(state.gram, free) & torch.isfinite(state.gram.sum((1, 2)))[:, None]
    pcov, unknown = _pcov(gram, cost2, kept, inverse, jacobian, free, unknown)
    status = torch.where((status >= 0) & unknown.any(1), SINGULAR, status)
    return ChunkResult(replace(state, status=status), pcov, 2.0 * state.cost)


def _information(model: BatchModel, state: BatchState, data: BatchData) -> torch.Tensor:
    """The Fisher information at p̂ per fit: the one the last accepted trial left in
    ``state`` (``InformedState``), evaluated again only for the fits without one."""
    info = (
        state.info if isinstance(state, InformedState) else torch.full_like(state.gram, torch.nan)
    )
    rest = torch.nonzero(~torch.isfinite(info.sum((1, 2)))).reshape(-1)
    if rest.numel() == 0:
        return info
    j, f = _poisson_point(model, state, data, rest)
    info = info.clone()
    info[rest] = estimators.information(j, f)
    return info


def _poisson_point(
    model: BatchModel, state: BatchState, data: BatchData, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(J, f) at p̂ of the fits ``index``."""
    part = data.take(index, model.x_per_fit)
    values, jac = model.values_and_jacobian(state.p[index], part.x)
    r, j = _residuals(values, jac, part)
    return j, r + part.y


def _poisson_jacobian(model: BatchModel, state: BatchState, data: BatchData) -> Jacobian:
    """J's rows over √f at p̂ of the fits of an index, the information's square root."""

    def jacobian(index: torch.Tensor) -> torch.Tensor:
        j, f = _poisson_point(model, state, data, index)
        return j * torch.where(f > 0, torch.rsqrt(torch.where(f > 0, f, 1.0)), 0.0)[..., None]

    return jacobian


def _lse_jacobian(model: BatchModel, state: BatchState, data: BatchData) -> Jacobian:
    def jacobian(index: torch.Tensor) -> torch.Tensor:
        return scaled_jacobian(model, state, data, index)

    return jacobian


def warn_results(status: torch.Tensor, pcov: torch.Tensor) -> None:
    """One ``OptimizeWarning`` counting the fits that failed, by status, and one
    ``CovarianceWarning`` counting those whose covariance holds inf (SciPy's text)."""
    failed = status <= 0
    if bool(failed.any()):
        counts = {int(k): int((status == k).sum()) for k in torch.unique(status[failed])}
        words = "; ".join(f"{n} × {k}: {STATUS_MESSAGES[k]}" for k, n in counts.items())
        warnings.warn(
            f"{int(failed.sum())} of {status.numel()} fits did not converge ({words}) "
            "HINT: full_output=True gives each fit's status; raise max_nfev or start nearer",
            OptimizeWarning,
            stacklevel=user_stacklevel(),
        )
    indeterminate = ~torch.isfinite(pcov).flatten(1).all(1)
    if bool(indeterminate.any()):
        warnings.warn(
            f"Covariance of the parameters could not be estimated for "
            f"{int(indeterminate.sum())} of {status.numel()} fits",
            CovarianceWarning,
            stacklevel=user_stacklevel(),
        )
