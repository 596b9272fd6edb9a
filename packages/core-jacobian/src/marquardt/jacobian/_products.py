"""What the engine hands out: Jacobian slices and normal-equation products.

For residuals ``r(θ) ∈ ℝᴿ`` (``R = N·m`` rows: ``m`` per sample) with Jacobian
``J = ∂r/∂θ ∈ ℝᴿˣᴾ``, the Gauss-Newton/Levenberg-Marquardt step (Marquardt 1963;
Nielsen 1999) needs either ``J`` itself (when ``R < P``: ``δ = Jᵀ(JJᵀ + λI)⁻¹r``) or only
``JᵀJ`` and ``Jᵀr`` (when ``R ≥ P``: ``(JᵀJ + λD)δ = Jᵀr``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

__all__ = ["JacobianSlice", "NormalProducts", "SliceStream"]


@dataclass
class JacobianSlice:
    """Rows ``start:stop`` of the flattened residual vector and of ``J``.

    Both tensors are fresh: the engine never writes them again once handed out.

    Arguments:
        start: the first row.
        stop: one past the last row.
        jacobian: the rows of ``J``, ``(stop - start) × P``.
        residuals: the residuals, ``(stop - start,)``.
    """

    start: int
    stop: int
    jacobian: torch.Tensor
    residuals: torch.Tensor

    @property
    def rows(self) -> int:
        """The number of residual rows in this slice."""
        return self.stop - self.start


@dataclass
class NormalProducts:
    """``JᵀJ`` (P×P), ``Jᵀr`` (P,), ``rss = rᵀr`` and the number of rows ``R``.

    Arguments:
        jtj: ``JᵀJ``, P × P.
        jtr: ``Jᵀr``, (P,).
        rss: ``rᵀr``, the residual sum of squares.
        rows: ``R``, the number of residual rows.
        timings: the seconds spent forming them: ``jacobian`` (everything, Gram products
            included), ``gram`` (the ``J_sᵀJ_s`` products), ``reduce`` (adding the
            devices' sums on ``devices[0]``) and ``transfer``.
    """

    jtj: torch.Tensor
    jtr: torch.Tensor
    rss: float
    rows: int
    timings: dict[str, float] = field(default_factory=dict)


class SliceStream:
    """The slices of ``J`` and ``r`` in row order, and the seconds spent producing them.

    Iterate once; ``timings`` is complete when the iteration is.

    Arguments:
        slices: the slices, in row order, produced as they are asked for.
        timings: filled in as the slices are produced: ``jacobian`` (seconds from the first
            request to the last slice) and ``transfer`` (copies to the output device).
    """

    def __init__(self, slices: Iterator[JacobianSlice], timings: dict[str, float]) -> None:
        self._slices = slices
        self.timings = timings

    def __iter__(self) -> Iterator[JacobianSlice]:
        return self._slices
