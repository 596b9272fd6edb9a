"""Fixed parameters that every fit holds at one shared value, taken out of the problem.

When ``fixed`` marks the same parameters in every fit and their p0 is the same in every
fit (a point-spread width known for the whole frame), the fits are those of the model
q ↦ f(x, *p(q)) over the fitted parameters q alone, the fixed values written in as
numbers: the LM's systems, J and every array over the parameters shrink to the fitted
ones, and each fit equals that of a model with those values written in. popt gets the
fixed values back and pcov zero rows and columns for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from .args import BatchArgs

__all__ = ["Reduction", "merged", "reduction"]


def merged(values: Sequence[float], free: Sequence[int], q: Sequence[Any]) -> list[Any]:
    """Every parameter of the model: ``values`` with the fitted ones (indices ``free``)
    replaced by ``q``."""
    full: list[Any] = list(values)
    for k, value in zip(free, q, strict=True):
        full[k] = value
    return full


@dataclass(frozen=True)
class Reduction:
    """The reduced call: its model, its arguments, and the fitted parameters' indices."""

    f: Callable[..., Any]
    args: BatchArgs
    free: tuple[int, ...]
    values: tuple[float, ...]

    def expanded(self, popt: torch.Tensor, pcov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """popt (M × P) and pcov (M × P × P) over every parameter."""
        fits, params = popt.shape[0], len(self.values)
        index = torch.tensor(self.free, device=popt.device)
        full = torch.tensor(self.values, dtype=popt.dtype, device=popt.device).repeat(fits, 1)
        full[:, index] = popt
        cov = pcov.new_zeros((fits, params, params))
        cov[:, index[:, None], index[None, :]] = pcov
        return full, cov


def reduction(f: Callable[..., Any], args: BatchArgs) -> Reduction | None:
    """The reduced call of a call whose fixed parameters are the same ones, at the same
    values, in every fit; None for any other call."""
    if args.free is None or not bool((args.free.all(0) == args.free.any(0)).all()):
        return None
    mask = args.free[0]
    column = args.p0[:, ~mask]
    if not bool((column == column[:1]).all()):
        return None
    free = tuple(int(k) for k in torch.nonzero(mask).reshape(-1))
    values = tuple(float(v) for v in args.p0[0])

    def model(x: Any, *q: Any) -> Any:
        return f(x, *merged(values, free, q))

    index = torch.tensor(free, device=args.p0.device)
    reduced = replace(
        args,
        p0=args.p0[:, index],
        lower=args.lower[:, index],
        upper=args.upper[:, index],
        free=None,
    )
    return Reduction(model, reduced, free, values)
