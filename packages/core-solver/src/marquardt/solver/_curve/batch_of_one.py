"""The compiled path of `curve_fit`: a torch model's fit run as a batch of one.

``curve_fit_batch``'s core (``_curve.batch.curve_fit_batch``: the batched LM of
``_curve.batched_lm.driver`` with its compiled iteration, start and covariance of
``_curve.compiled_lm``) fits one data set as well as many: f, J (forward mode), JᵀJ and
Jᵀr in one fused pass over the points per iteration, where the host path
(``_curve.scipy.to_single``) evaluates f P + 1 times for differences and solves on the host. The fit
takes this path when ``compile`` allows it and a kernel is at hand: kept on disk by an
earlier process (or this one) for this model and these shapes, or to be compiled
(``compile=True``, or under ``"auto"`` a fit whose eager time repays the compile). It
serves what the batch core serves: a torch model of x given as an array of N points (or
k × N), y on the CPU, σ as numbers, bounds, robust losses, SciPy's tests; the rest runs on
the host path. Both paths minimise the same cost with the same tests; p̂ agrees to the
tests' reach, pcov is SciPy's formula at p̂.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .batch.args import BatchArgs
from .batch.curve_fit_batch import kernel_ready, planned, solved
from .batch.model import check_model
from .batched_lm.state import STATUS_MESSAGES
from .scipy.args import not_found
from .scipy.covariance import leastsq_info, warn_indeterminate
from .scipy.data import FitData
from .scipy.options import FitOptions
from .scipy.providers import Whitening

__all__ = ["compiled_fit", "serves"]


def serves(data: FitData, options: FitOptions) -> bool:
    """Whether the batch core can run this fit: x an array of the N points (or k × N), σ
    absent or numbers (not a covariance matrix), and ``full_output``'s J at p̂ the plain
    one (a linear loss).

    Arguments:
        data: the fit's checked data.
        options: its checked keywords.

    Returns:
        Whether `compiled_fit` may run it.
    """
    x, y, weights = data.x, data.y, data.weights
    shaped = isinstance(x, np.ndarray) and x.ndim in (1, 2) and x.shape[-1] == y.size
    plain = not (options.full_output and options.loss != "linear")
    return shaped and weights.factor is None and plain


def _one_fit(
    x: np.ndarray, y: np.ndarray, weights: Whitening, options: FitOptions
) -> BatchArgs | None:
    """The fit as ``curve_fit_batch``'s arguments, from what `curve_fit` checked already
    (x shared by the one fit, as f takes it); None for data that are not all finite (left
    to the host path, which takes them as SciPy does)."""
    if not (np.isfinite(y).all() and np.isfinite(x).all()):
        return None
    w = weights.inverse_sigma

    def row(values: Any) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).reshape(1, -1)

    return BatchArgs(
        x=torch.from_numpy(np.ascontiguousarray(x)),
        x_per_fit=False,
        y=row(y),
        w=None if w is None else row(np.broadcast_to(w, y.shape)),
        mask=None,
        p0=row(options.start),
        lower=row(options.lower),
        upper=row(options.upper),
        losses=(options.loss,),
        loss_index=torch.zeros(1, dtype=torch.int64),
        f_scale=torch.tensor([options.f_scale], dtype=torch.float64),
        tests=options.tests,
        torch_out=False,
        out_device=torch.device("cpu"),
    )


def compiled_fit(
    f: Callable[..., Any], data: FitData, options: FitOptions, mode: str | bool
) -> Any | None:
    """The fit as a batch of one (module docstring), in `curve_fit`'s forms; None where
    ``mode`` is ``"auto"``, no kernel is kept and the fit is too small to compile for.

    **Arguments:**

    - ``f``: `curve_fit`'s; ``data``: its data, after NaN points were dropped.
    - ``options``: the checked keywords.
    - ``mode``: ``compile``, checked (``"auto"`` or True; False never reaches here).
    """
    args = _one_fit(data.x, data.y, data.weights, options)
    if args is None:
        return None
    run = planned(f, args, mode, None, None)
    if not kernel_ready(run, args):
        if run.iterate is None or not run.iterate.may_compile:
            return None
        check_model(run.model, args.p0, args.x)
    popt_t, pcov_t, info = solved(run, args, options.absolute_sigma)
    status = int(info["status"][0])
    if status == 0:
        raise not_found(STATUS_MESSAGES[status], options.tests.max_nfev)
    popt, pcov = popt_t[0].numpy(), pcov_t[0].numpy()
    if not np.isfinite(pcov).all():
        warn_indeterminate()
    result = data.returned(popt, pcov)
    if not options.full_output:
        return result
    values, jac = run.model.values_and_jacobian(popt_t, args.x)
    w = torch.ones_like(args.y[0]) if args.w is None else args.w[0]
    residuals = ((values[0] - args.y[0]) * w).numpy()
    final = (jac[0] * w[:, None]).numpy()
    infodict: dict[str, Any] = {
        "nfev": int(info["nfev"][0]),
        "njev": int(info["njev"][0]),
        "fvec": residuals,
    }
    if options.method == "lm":
        infodict.update(leastsq_info(final, residuals))
    return (*result, infodict, STATUS_MESSAGES[status], status)
