"""Residual providers for the small-fit path: given p (P,), the residuals r (N,) and J (N × P).

r = W(f(x, p) − y), with W = diag(1/σ) (σ scalar or one per point) or W = L⁻¹ for a
covariance matrix C = LLᵀ (SciPy's whitening). Three ways to get J:

* ``TorchProvider``: f written with torch operations; J by forward-mode autodiff
  (``torch.func.jacfwd``; one ``torch.func.jvp`` per parameter when f cannot be vmapped).
* ``DifferenceProvider``: any f (NumPy, SciPy special functions, ...); J by SciPy's finite
  differences ("2-point", "3-point", "cs"), with SciPy's steps: h = s·sign(p)·max(1, |p|),
  s = ε^½ (2-point, cs) or ε^⅓ (3-point), or h = diff_step·sign(p)·|p| when given; a
  step that would leave the bounds is taken the other way (``step_signs``).
* ``DifferenceProvider`` with ``jac``: the user's J(x, *p), whitened like r.

A torch model with a named scheme or a ``jac`` is still evaluated on tensors (the steps'
differences, complex tensors for "cs"): ``TorchProvider`` lends its ``values`` to a
``DifferenceProvider``.

``model_kind`` decides, with one call of f on the start point, which of the first two a
model gets. Parameters a torch model turned into Python
floats (``math.exp(b)``), which autodiff would silently treat as constants, are found by
``scipy_edge`` from J's columns at the start.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "DifferenceProvider",
    "Differences",
    "TorchProvider",
    "Whitening",
    "absolute_steps",
    "model_kind",
]

_EPS = float(np.finfo(np.float64).eps)


class Whitening:
    """W in r = W(f − y): None (σ = 1), a vector of 1/σ, or the lower Cholesky factor L of C."""

    def __init__(self, inverse_sigma: np.ndarray | None, factor: np.ndarray | None) -> None:
        self.inverse_sigma = inverse_sigma
        self.factor = factor

    def apply(self, values: np.ndarray) -> np.ndarray:
        """W·values for values of shape (N,) or (N, P)."""
        if self.factor is not None:
            try:
                from scipy.linalg import solve_triangular

                return np.asarray(solve_triangular(self.factor, values, lower=True))
            except ImportError:  # pragma: no cover - SciPy is optional
                return np.asarray(np.linalg.solve(self.factor, values))
        if self.inverse_sigma is None:
            return values
        w = self.inverse_sigma
        return np.asarray(values * (w if values.ndim == 1 else w[:, None]))


def absolute_steps(p: np.ndarray, scheme: str, diff_step: np.ndarray | None) -> np.ndarray:
    """SciPy's finite-difference step per parameter (module docstring)."""
    sign = np.where(p >= 0, 1.0, -1.0)
    relative = _EPS ** (1.0 / 3.0) if scheme == "3-point" else _EPS**0.5
    default = relative * sign * np.maximum(1.0, np.abs(p))
    if diff_step is None:
        return np.asarray(default)
    given = diff_step * sign * np.abs(p)
    return np.asarray(np.where((p + given) - p == 0, default, given))


@dataclass(frozen=True)
class Differences:
    """How J is differenced: SciPy's scheme (``"2-point"``, ``"3-point"``, ``"cs"``), its
    relative step (None: SciPy's default) and the bounds the steps respect; or the user's
    ``jac``, which replaces them."""

    lower: np.ndarray
    upper: np.ndarray
    scheme: str = "2-point"
    diff_step: np.ndarray | None = None
    jac: Callable[..., Any] | None = None


class DifferenceProvider:
    """r and J of a model evaluated on NumPy values (module docstring)."""

    def __init__(
        self,
        f: Callable[..., Any],
        x: Any,
        y: np.ndarray,
        whitening: Whitening,
        differences: Differences,
    ) -> None:
        self.f, self.x, self.y, self.whitening = f, x, y, whitening
        self.scheme, self.diff_step = differences.scheme, differences.diff_step
        self.jac = differences.jac
        self.lower, self.upper = differences.lower, differences.upper
        self.evaluations = 0

    def values(self, p: np.ndarray) -> np.ndarray:
        """f(x, *p) as a float64 vector of N values (complex for the "cs" scheme)."""
        self.evaluations += 1
        out = np.asarray(self.f(self.x, *p))
        if out.dtype.kind != "c":
            out = out.astype(np.float64, copy=False)
        return np.broadcast_to(out, self.y.shape) if out.size == 1 else out.reshape(-1)

    def residuals(self, p: np.ndarray) -> np.ndarray:
        return self.whitening.apply(self.values(p) - self.y)

    def jacobian(self, p: np.ndarray, r: np.ndarray) -> np.ndarray:
        """J at p, where the residuals are r."""
        if self.jac is not None:
            j = np.asarray(self.jac(self.x, *p), dtype=np.float64)
            j = j.reshape(self.y.size, p.size) if j.ndim != 2 else j
            return self.whitening.apply(j)
        h = absolute_steps(p, self.scheme, self.diff_step)
        columns = np.empty((r.size, p.size))
        if self.scheme == "cs":
            for k in range(p.size):
                shifted = p.astype(np.complex128)
                shifted[k] += 1j * h[k]
                out = self.whitening.apply(self.values(shifted) - self.y)
                columns[:, k] = np.imag(out) / h[k]
            return columns
        forward = self.lower <= p + h
        forward &= p + h <= self.upper
        for k in range(p.size):
            step = h[k] if forward[k] else -h[k]
            one = p.copy()
            one[k] = p[k] + step
            if self.scheme == "2-point":
                columns[:, k] = (self.residuals(one) - r) / (one[k] - p[k])
                continue
            two = p.copy()
            if self.lower[k] <= p[k] - h[k] and p[k] + h[k] <= self.upper[k]:
                two[k] = p[k] - h[k]
                one[k] = p[k] + h[k]
                columns[:, k] = (self.residuals(one) - self.residuals(two)) / (one[k] - two[k])
            else:
                two[k] = p[k] + 2.0 * step
                r1, r2 = self.residuals(one), self.residuals(two)
                columns[:, k] = (-3.0 * r + 4.0 * r1 - r2) / (two[k] - p[k])
        return columns


class TorchProvider:
    """r and J of a model written with torch operations, J by forward-mode autodiff."""

    def __init__(
        self,
        f: Callable[..., torch.Tensor],
        x: Any,
        y: np.ndarray,
        whitening: Whitening,
        differences: Differences | None = None,
        first: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.f, self.whitening, self.y = f, whitening, y
        #: (p, f(x, *p)) already evaluated, returned by the first ``values`` call at that p.
        self._first = first
        self.x = torch.as_tensor(x, dtype=torch.float64) if isinstance(x, np.ndarray) else x
        self.evaluations = 0
        self._vmap = True
        #: Steps with SciPy's differences of f evaluated on tensors, or the user's ``jac``
        #: (``differences``, with the bounds the steps respect): on the CPU P + 1
        #: evaluations of f cost several times less than one autodiff Jacobian;
        #: ``exact_jacobian`` gives J at p̂.
        self.differences: DifferenceProvider | None = None
        if differences is not None:
            numeric = DifferenceProvider(f, x, y, whitening, differences)
            numeric.values = self.values  # type: ignore[method-assign]
            self.differences = numeric

    def _call(self, theta: torch.Tensor) -> torch.Tensor:
        out = self.f(self.x, *theta.unbind())
        return out.reshape(-1) if out.numel() != 1 else out.reshape(-1).expand(self.y.size)

    def residuals(self, p: np.ndarray) -> np.ndarray:
        return self.whitening.apply(self.values(p) - self.y)

    def values(self, p: np.ndarray) -> np.ndarray:
        """f(x, *p) as NumPy values, without autodiff (for finite differences)."""
        self.evaluations += 1
        first, self._first = self._first, None
        if first is not None and np.array_equal(first[0], p):
            return first[1] if first[1].size != 1 else np.broadcast_to(first[1], self.y.shape)
        with torch.no_grad():
            return self._call(torch.from_numpy(np.ascontiguousarray(p))).numpy()

    def jacobian(self, p: np.ndarray, r: np.ndarray) -> np.ndarray:
        if self.differences is not None:
            return self.differences.jacobian(p, r)
        return self.exact_jacobian(p)

    def exact_jacobian(self, p: np.ndarray) -> np.ndarray:
        """J at p by autodiff: reverse mode twice (g(u) = Jᵀu, then J e_k = ∂g_k/∂u: 1 + P
        backward passes, faster than ``jacfwd`` from 10³ to 10⁵ points); by forward mode
        where f lacks second derivatives."""
        theta = torch.from_numpy(p.copy())
        try:
            return self.whitening.apply(self._twice_reversed(theta))
        except RuntimeError:
            pass
        if self._vmap:
            try:
                j = torch.func.jacfwd(self._call)(theta)
                return self.whitening.apply(j.detach().numpy())
            except Exception:  # f cannot be vmapped (e.g. .item(), data-dependent flow)
                self._vmap = False
        eye = torch.eye(p.size, dtype=torch.float64)
        cols = [torch.func.jvp(self._call, (theta,), (eye[k],))[1] for k in range(p.size)]
        return self.whitening.apply(torch.stack(cols, dim=1).detach().numpy())

    def _twice_reversed(self, theta: torch.Tensor) -> np.ndarray:
        t = theta.requires_grad_(True)
        out = self._call(t)
        u = torch.zeros_like(out, requires_grad=True)
        (g,) = torch.autograd.grad(out, t, u, create_graph=True)
        cols = [torch.autograd.grad(g[k], u, retain_graph=True)[0] for k in range(t.numel())]
        return torch.stack(cols, dim=1).detach().numpy()


def model_kind(
    f: Callable[..., Any], x: Any, p0: np.ndarray
) -> tuple[str, str, list[int], np.ndarray | None]:
    """("torch", "", untracked, f(x, *p0)) when f(x, *p) runs on torch tensors and returns a
    tensor that tracks the parameters, with the parameters its autodiff graph does not reach
    (candidates for ``float(p)``) and its values at p0 (the fit's first evaluation: f is
    never called twice in a row at one point, SciPy's gh-13670); ("numpy", why, [], None)
    otherwise. One call of f and one backward pass, before any work."""
    xt = torch.as_tensor(x, dtype=torch.float64) if isinstance(x, np.ndarray) else x
    params = [torch.tensor(float(v), dtype=torch.float64, requires_grad=True) for v in p0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. float() of a tensor that requires grad
            out = f(xt, *params)
    except Exception as err:  # NumPy functions refuse tensors that require grad
        return "numpy", f"f raised {type(err).__name__} on torch tensors", [], None
    if not isinstance(out, torch.Tensor):
        return "numpy", f"f returned {type(out).__name__}, not a torch.Tensor", [], None
    if not out.requires_grad:
        return "numpy", "f's output does not track its parameters under autodiff", [], None
    grads = torch.autograd.grad(out.sum(), params, allow_unused=True)
    values = out.detach().to(torch.float64).reshape(-1).numpy().copy()
    return "torch", "", [k for k, g in enumerate(grads) if g is None], values
