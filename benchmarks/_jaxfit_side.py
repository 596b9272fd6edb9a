"""JAXFit's side of ``bench_small_fit``, run under the interpreter of a JAXFit install.

JAXFit (``pip install jaxfit``) is SciPy's ``curve_fit`` written with JAX: its trust-region
loop compiled by XLA, the Jacobian by JAX's autodiff. It pins versions of JAX, NumPy and
SciPy of its own, so it lives in an environment of its own, whose Python is
``JAXFIT_PYTHON``; ``bench_small_fit`` runs this module there through ``_child.py`` (its
``launcher``). Only NumPy, JAX and JAXFit are imported here (neither torch nor marquardt).

The models are ``marquardt.testing.problems``' ``decay`` and ``gaussian``, written with
``jax.numpy`` as JAXFit asks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxfit import CurveFit


def decay(x: Any, a: Any, b: Any, c: Any) -> Any:
    """y = a·exp(−b·x) + c."""
    return a * jnp.exp(-b * x) + c


def gaussian(x: Any, a: Any, mu: Any, s: Any, offset: Any) -> Any:
    """y = a·exp(−((x − μ)/s)²/2) + offset."""
    return a * jnp.exp(-0.5 * ((x - mu) / s) ** 2) + offset


#: The problem's name in ``bench_small_fit`` -> its model in JAX.
MODELS: dict[str, Callable[..., Any]] = {"decay": decay, "gaussian": gaussian}


def measure(data: str, name: str, warm_calls: int, repeats: int) -> dict[str, Any]:
    """JAXFit's first call, then the median of ``repeats`` calls after ``warm_calls`` more.

    **Arguments:**

    - `data`: an ``.npz`` file holding ``x``, ``y`` and ``p0`` (float64).
    - `name`: the model's name in ``MODELS``.
    - `warm_calls`: calls after the first and before the timed ones.
    - `repeats`: timed calls.

    **Returns:** ``first_call`` and ``median`` (seconds), ``popt`` of the last call, and the
    versions of JAXFit, JAX and NumPy.
    """
    arrays = np.load(data)
    x, y, p0 = arrays["x"], arrays["y"], arrays["p0"]
    model = MODELS[name]
    fitter = CurveFit()  # one fitter: JAXFit compiles per data length, once

    def fit() -> tuple[float, np.ndarray]:
        start = time.perf_counter()
        popt = np.asarray(fitter.curve_fit(model, x, y, p0=p0)[0])
        return time.perf_counter() - start, popt

    first = fit()[0]
    for _ in range(warm_calls):
        fit()
    timed = [fit() for _ in range(repeats)]
    return {
        "first_call": first,
        "median": statistics.median(t for t, _ in timed),
        "popt": [float(v) for v in timed[-1][1]],
        "versions": {k: metadata.version(k) for k in ("jaxfit", "jax", "jaxlib", "numpy")},
    }
