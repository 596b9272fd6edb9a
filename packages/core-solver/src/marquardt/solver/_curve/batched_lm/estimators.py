"""The costs of the batched LM other than least squares: Gpufit's Poisson maximum likelihood.

For counts y ≥ 0 and a model f > 0 (f ≥ 0 where y = 0) the Poisson deviance is
D = 2Σᵢ [fᵢ − yᵢ − yᵢ·ln(fᵢ/yᵢ)] (the term yᵢ·ln is 0 where yᵢ = 0), and the fit minimises
C = D/2 by LM on its Gauss–Newton approximation, as Gpufit's MLE estimator does (Laurence and
Chromy 2010; Przybylski et al. 2017): the gradient g = Σᵢ (1 − yᵢ/fᵢ)·∂fᵢ/∂p and the curvature
H = Σᵢ (yᵢ/fᵢ²)·∂fᵢ/∂p·∂fᵢ/∂pᵀ, which equals the Hessian of C where f = y. H is J̃ᵀJ̃ with
J's rows scaled by √yᵢ/fᵢ; the scaled residuals r̃ᵢ = √(2dᵢ), with dᵢ each point's term of
C, make ½‖r̃‖² = C, so that the linear model's reduction −gᵀs − ½sᵀHs is the batched LM's
without an offset. A fit whose f is non-positive at a point with counts (or negative) has
C = inf and NaN rows, which the LM refuses as it refuses a non-finite f: at the start the
fit stops, a trial there is rejected and λ raised.
"""

from __future__ import annotations

import torch

__all__ = ["ESTIMATORS", "information", "informed", "measure", "normal", "valid_model"]

#: The estimators of this module, by the name ``curve_fit_batch`` takes.
ESTIMATORS = ("poisson",)


def _refuse(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; this module serves {ESTIMATORS}")


def valid_model(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Where the Poisson likelihood is defined: f > 0 at a count, f ≥ 0 elsewhere (M × N)."""
    return torch.where(y > 0, f > 0, f >= 0)


def measure(
    estimator: str, r: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(C = D/2 per fit, J's row scale √y/f, r̃ = √(2d)) from r = f − y (module docstring).

    Arguments:
        estimator: ``"poisson"``.
        r: f − y (M × N), zero at the points a mask drops (where y is zero too).
        y: the counts (M × N).

    Returns:
        C (M,), inf for a fit whose model is invalid; the row scale (M × N), NaN for such a
        fit; r̃ (M × N).
    """
    _refuse(estimator)
    f = r + y
    counts = y > 0
    ok = valid_model(f, y)
    # 1 where there is no count (y = 0 there, so that √y/1 and y·ln(1/1) are the zeros
    # asked) or the model is invalid (the fit's C is inf and its rows NaN anyway).
    safe_f = torch.where(counts & ok, f, 1.0)
    bad = ~ok.all(1)
    term = _terms(f, y, safe_f, counts)
    cost = torch.where(bad, torch.inf, term.sum(1).to(r.dtype))
    rows = torch.where(bad[:, None], torch.nan, torch.sqrt(y) / safe_f)
    return cost, rows, torch.sqrt(2.0 * torch.clamp(term, min=0.0).to(r.dtype))


def _terms(
    f: torch.Tensor, y: torch.Tensor, safe_f: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """Each point's f − y − y·ln(f/y), in float64 at least: near the optimum the three
    cancel to about (f − y)²/2y, and in float32 the cancellation leaves the cost rounded
    to ~1e-4 of itself, too coarse for ftol, so that fits stopped on xtol after steps
    rejected for rounding (the term itself is well conditioned in f: ∂/∂f = 1 − y/f).
    Where y = 0, safe_f and the y in the logarithm are 1, so that y·ln is 0."""
    wide = torch.promote_types(f.dtype, torch.float64)
    y64 = y.to(wide)
    safe_y = torch.where(counts, y, 1.0).to(wide)
    return f.to(wide) - y64 - y64 * torch.log(safe_f.to(wide) / safe_y)


def normal(
    estimator: str, j: torch.Tensor, rows: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, g) per fit from J (M × N × P) and ``measure``'s row scale: H = J̃ᵀJ̃ with J̃ = J's
    rows times √y/f, g = Jᵀ(1 − y/f) (y/f = rows·√y, 0 where y = 0).

    Arguments:
        estimator: ``"poisson"``.
        j: ∂f/∂p (M × N × P), zero at dropped points and fixed parameters.
        rows: √y/f (M × N).
        y: the counts (M × N).

    Returns:
        H (M × P × P) and g (M × P).
    """
    _refuse(estimator)
    js = j * rows[..., None]
    gram = torch.einsum("mnp,mnq->mpq", js, js)
    return gram, torch.einsum("mnp,mn->mp", j, 1.0 - rows * torch.sqrt(y))


def information(j: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """The Fisher information of Poisson counts, Σᵢ ∂fᵢ∂fᵢᵀ/fᵢ (M × P × P), over the points
    where f > 0 (J is zero at dropped points): its inverse is the Cramér–Rao bound."""
    scale = torch.where(f > 0, torch.rsqrt(torch.where(f > 0, f, torch.ones_like(f))), 0.0)
    js = j * scale[..., None]
    return torch.einsum("mnp,mnq->mpq", js, js)


def informed(
    info: torch.Tensor, stop: torch.Tensor, j: torch.Tensor, f: torch.Tensor
) -> torch.Tensor:
    """``info`` (M × P × P) with the Fisher information of the fits ``stop`` (M,), those
    that stopped on the accepted trial whose J (M × N × P) and f (M × N) are given, put in:
    their pcov then needs no evaluation of its own, and the fits still running pay nothing.

    Arguments:
        info: the information kept so far (NaN for the fits without one).
        stop: the fits that stopped on this trial.
        j: ∂f/∂p at the trial (zero at dropped points and fixed parameters).
        f: the model at the trial.

    Returns:
        The new ``info``, a tensor of its own (as each field of a new state is).
    """
    out = info.clone()
    index = torch.nonzero(stop).reshape(-1)
    if index.numel():
        out[index] = information(j[index], f[index])
    return out
