"""Poisson maximum likelihood and fixed parameters in ``curve_fit_batch``, as Gpufit's
users fit spots.

Problem: elliptic 2-D Gaussian spots a·exp(−½((x−x₀)²/σx² + (y−y₀)²/σy²)) + b on 7 × 7
pixels, Poisson counts; amplitude U(50, 500), centre 3 ± U(−0.5, 0.5), σx and σy
U(1.0, 1.6), background 10; starts: amplitude, widths and background × U(0.8, 1.2), centre
± U(−0.3, 0.3). ``SPOTS`` spots (``QUICK_SPOTS`` with ``--quick``), float32, as Gpufit
fits them.

Sides, in the same run and the same way (one warm-up call on a chunk's worth of spots,
then one timed call each, the two sides alternating, each first in every other repeat,
``REPEATS`` times, the fastest kept; ``compile=False`` on both: the Poisson estimator
runs the eager iteration, so least squares does too):

* ``estimator="lse"`` against ``estimator="poisson"``: fits/s (target: Poisson ≥ 0.8× least
  squares), the position error (rms of x₀ and y₀ against the truth) and the background
  bias (mean b̂ − 10) of each;
* the reference: SciPy's ``minimize`` (BFGS, analytic gradient, gtol 1e-10, float64) of
  the same likelihood on the first ``REFERENCE`` spots, against our Poisson fit of those
  spots in float64 (tolerances 1e-12: target 1e-5 relative on every parameter) and the
  float32 fit of the timed run (shown for information);
* fixed parameters: spots of known widths (1.3, 1.1), float64; the six-parameter model
  with the widths fixed (``fixed=``) against the four-parameter model with the widths
  written in: the largest relative difference of the four fitted parameters (target
  1e-8) and the fits/s of each (target: fixed ≥ 1× the four-parameter model).

``python benchmarks/run_all.py poisson_mle [--quick]``.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import _machine
import numpy as np
import torch
from _registry import Options
from _rows import row
from scipy.optimize import minimize

SPOTS = 100_000
QUICK_SPOTS = 5_000
REFERENCE = 200
QUICK_REFERENCE = 40
REPEATS = 3
SIDE = 7
RATE_TARGET = 0.8
AGREEMENT_TARGET = 1e-5
FIXED_TARGET = 1e-8
FIXED_SPEED_TARGET = 1.0
WIDTHS = (1.3, 1.1)
TIGHT = {"ftol": 1e-12, "xtol": 1e-12, "gtol": 1e-12}


def spot(xy: torch.Tensor, a: Any, x0: Any, y0: Any, sx: Any, sy: Any, b: Any) -> torch.Tensor:
    u = (xy[0] - x0) / sx
    v = (xy[1] - y0) / sy
    return a * torch.exp(-0.5 * (u * u + v * v)) + b


def spot4(xy: torch.Tensor, a: Any, x0: Any, y0: Any, b: Any) -> torch.Tensor:
    return spot(xy, a, x0, y0, WIDTHS[0], WIDTHS[1], b)


def problem(fits: int, seed: int = 0, widths: tuple[float, float] | None = None) -> dict[str, Any]:
    """``fits`` spots (module docstring): x (2, 49), y (fits, 49), p0 and true (fits, 6)."""
    rng = np.random.default_rng(seed)
    index = np.arange(SIDE * SIDE)
    grid = np.stack([index % SIDE, index // SIDE]).astype(np.float64)
    sx = rng.uniform(1.0, 1.6, (fits, 2)) if widths is None else np.tile(widths, (fits, 1))
    true = np.c_[
        rng.uniform(50, 500, fits), 3 + rng.uniform(-0.5, 0.5, (fits, 2)), sx, np.full(fits, 10.0)
    ]
    f = spot(torch.from_numpy(grid), *torch.from_numpy(true).T[:, :, None]).numpy()
    y = rng.poisson(f).astype(np.float64)
    scale = np.c_[rng.uniform(0.8, 1.2, fits), np.ones((fits, 2)), rng.uniform(0.8, 1.2, (fits, 3))]
    p0 = true * scale
    p0[:, 1:3] += rng.uniform(-0.3, 0.3, (fits, 2))
    if widths is not None:
        p0[:, 3:5] = widths
    return {"x": grid, "y": y, "p0": p0, "true": true}


def _order(sides: dict[str, float], repeat: int) -> list[str]:
    """The sides in turn, the first of one repeat last in the next."""
    names = list(sides)
    return names if repeat % 2 == 0 else names[::-1]


def _timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def _fit(prob: dict[str, Any], dtype: torch.dtype, fits: int | None = None, **kw: Any) -> Any:
    from marquardt.solver import curve_fit_batch

    f = kw.pop("f", spot)
    p0 = kw.pop("p0", prob["p0"])
    x = torch.from_numpy(prob["x"]).to(dtype)
    y = torch.from_numpy(prob["y"][:fits]).to(dtype)
    start = torch.from_numpy(np.ascontiguousarray(p0[:fits])).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return curve_fit_batch(f, x, y, start, full_output=True, compile=False, **kw)


def _accuracy(popt: np.ndarray, true: np.ndarray, status: np.ndarray) -> dict[str, float]:
    ok = status > 0
    err = popt[ok][:, 1:3] - true[ok][:, 1:3]
    return {
        "position_rms": float(np.sqrt(np.mean(err**2))),
        "background_bias": float(np.mean(popt[ok][:, 5] - true[ok][:, 5])),
        "converged": float(np.mean(ok)),
    }


def _half_deviance(p: np.ndarray, x: torch.Tensor, y: torch.Tensor) -> tuple[float, np.ndarray]:
    t = torch.tensor(p, requires_grad=True)
    f = spot(x, *t)
    logs = torch.where(y > 0, y * torch.log(f / torch.where(y > 0, y, 1.0)), 0.0)
    c = torch.where(torch.isfinite(f).all() & (f > 0).all(), (f - y - logs).sum(), torch.inf)
    c.backward()
    return float(c.detach()), t.grad.numpy().copy()  # type: ignore[union-attr]


def reference(prob: dict[str, Any], count: int) -> np.ndarray:
    """SciPy ``minimize`` (BFGS) of ½ the Poisson deviance per spot, float64."""
    x = torch.from_numpy(prob["x"])
    out = []
    for m in range(count):
        y = torch.from_numpy(prob["y"][m])
        res = minimize(
            _half_deviance,
            prob["p0"][m],
            args=(x, y),
            jac=True,
            method="BFGS",
            options={"gtol": 1e-10, "maxiter": 2000},
        )
        out.append(res.x)
    return np.array(out)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def speed_part(prob: dict[str, Any], fits: int) -> dict[str, Any]:
    """Least squares and Poisson, float32, alternating (module docstring)."""
    warm = min(fits, 16_384)
    _fit(prob, torch.float32, warm)
    _fit(prob, torch.float32, warm, estimator="poisson")
    best = {"lse": np.inf, "poisson": np.inf}
    outs: dict[str, Any] = {}
    for repeat in range(REPEATS):
        for name in _order(best, repeat):
            seconds, outs[name] = _timed(
                lambda n=name: _fit(prob, torch.float32, fits, estimator=n)
            )
            best[name] = min(best[name], seconds)
    part: dict[str, Any] = {"fits": fits, "repeats": REPEATS}
    for name, (popt, _, info) in outs.items():
        part[name] = {
            "seconds": best[name],
            "fits_per_s": fits / best[name],
            **_accuracy(popt.double().numpy(), prob["true"][:fits], info["status"].numpy()),
        }
    part["rate_ratio"] = part["poisson"]["fits_per_s"] / part["lse"]["fits_per_s"]
    part["popt32"] = outs["poisson"][0].double().numpy()
    return part


def reference_part(prob: dict[str, Any], count: int, popt32: np.ndarray) -> dict[str, Any]:
    ref = reference(prob, count)
    ours, _, info = _fit(prob, torch.float64, count, estimator="poisson", **TIGHT)
    ok = info["status"].numpy() > 0
    return {
        "spots": count,
        "max_relative_float64": _relative(ours.numpy()[ok], ref[ok]),
        "max_relative_float32": _relative(popt32[:count][ok], ref[ok]),
        "reference_position_rms": _accuracy(ref, prob["true"][:count], np.ones(count))[
            "position_rms"
        ],
        "reference_background_bias": _accuracy(ref, prob["true"][:count], np.ones(count))[
            "background_bias"
        ],
    }


def fixed_part(fits: int) -> dict[str, Any]:
    prob = problem(fits, seed=1, widths=WIDTHS)
    mask = np.array([False, False, False, True, True, False])
    four_p0 = prob["p0"][:, [0, 1, 2, 5]]
    warm = min(fits, 16_384)
    _fit(prob, torch.float64, warm, fixed=mask)
    _fit(prob, torch.float64, warm, f=spot4, p0=four_p0)
    best = {"fixed": np.inf, "four": np.inf}
    calls = {
        "fixed": lambda: _fit(prob, torch.float64, fits, fixed=mask),
        "four": lambda: _fit(prob, torch.float64, fits, f=spot4, p0=four_p0),
    }
    outs: dict[str, Any] = {}
    for repeat in range(REPEATS):
        for name in _order(best, repeat):
            seconds, outs[name] = _timed(calls[name])
            best[name] = min(best[name], seconds)
    fixed, four = outs["fixed"][0].numpy()[:, [0, 1, 2, 5]], outs["four"][0].numpy()
    tight_fixed = _fit(prob, torch.float64, 2000, fixed=mask, **TIGHT)[0].numpy()
    tight_four = _fit(prob, torch.float64, 2000, f=spot4, p0=four_p0, **TIGHT)[0].numpy()
    return {
        "fits": fits,
        "max_relative_default_tolerances": _relative(fixed, four),
        "max_relative_tight": _relative(tight_fixed[:, [0, 1, 2, 5]], tight_four),
        "fixed_fits_per_s": fits / best["fixed"],
        "four_fits_per_s": fits / best["four"],
        "speed_ratio": best["four"] / best["fixed"],
    }


def run(o: Options) -> dict[str, Any]:
    """The benchmark, as ``run_all.py`` runs it (CPU only)."""
    torch.set_num_threads(2)
    fits = QUICK_SPOTS if o.quick else SPOTS
    count = QUICK_REFERENCE if o.quick else REFERENCE
    prob = problem(fits)
    results: dict[str, Any] = {
        "device": "cpu",
        "quick": o.quick,
        "machine": {k: v for k, v in _machine.describe().items() if k in ("cpu", "cores", "torch")},
        "load_before": _machine.load_average(),
    }
    speed = speed_part(prob, fits)
    popt32 = speed.pop("popt32")
    results["speed"] = speed
    results["reference"] = reference_part(prob, count, popt32)
    results["fixed"] = fixed_part(fits)
    results["load_after"] = _machine.load_average()
    return results


def rows(results: dict[str, Any]) -> list[Any]:
    s, r, fx = results["speed"], results["reference"], results["fixed"]
    load = f"load {results['load_before']:.1f} → {results['load_after']:.1f}"
    n = f"{s['fits']:,} spots float32"
    return [
        row(
            f"poisson_mle {n}: Poisson fits/s / least squares fits/s",
            s["rate_ratio"],
            RATE_TARGET,
            op="≥",
            detail=f"Poisson {s['poisson']['fits_per_s']:,.0f}/s, least squares "
            f"{s['lse']['fits_per_s']:,.0f}/s, eager both, best of {s['repeats']}; {load}",
        ),
        row(
            f"poisson_mle {r['spots']} spots: max relative difference to SciPy minimize (float64)",
            r["max_relative_float64"],
            AGREEMENT_TARGET,
            unit="",
            detail=f"float32 fit of the timed run: {r['max_relative_float32']:.1e}",
        ),
        row(
            f"poisson_mle {fx['fits']:,} spots: widths fixed vs 4-parameter model, max relative "
            "difference (float64, tolerances 1e-12)",
            fx["max_relative_tight"],
            FIXED_TARGET,
            unit="",
            detail=f"default tolerances: {fx['max_relative_default_tolerances']:.1e}",
        ),
        row(
            f"poisson_mle {fx['fits']:,} spots: fixed widths fits/s / 4-parameter fits/s",
            fx["speed_ratio"],
            FIXED_SPEED_TARGET,
            op="≥",
            detail=f"fixed {fx['fixed_fits_per_s']:,.0f}/s, four {fx['four_fits_per_s']:,.0f}/s",
        ),
    ]


def section(results: dict[str, Any]) -> str:
    s, r = results["speed"], results["reference"]
    lines = [
        f"{results['machine']['cpu']}; load {results['load_before']:.1f} → "
        f"{results['load_after']:.1f}. {s['fits']:,} elliptic spots of 7 × 7 pixels, Poisson "
        f"counts, background 10, amplitude 50–500, float32; eager iteration on both sides, "
        f"best of {s['repeats']} timed calls. Reference: SciPy `minimize` of the same "
        f"likelihood on the first {r['spots']} spots.",
        "",
        "| estimator | fits/s | position rms (px) | background bias (photons) | converged |",
        "|---|---|---|---|---|",
    ]
    for name, label in (("lse", "least squares"), ("poisson", "Poisson MLE")):
        e = s[name]
        lines.append(
            f"| {label} | {e['fits_per_s']:,.0f} | {e['position_rms']:.4f} | "
            f"{e['background_bias']:+.3f} | {e['converged']:.4f} |"
        )
    lines.append(
        f"| SciPy minimize (first {r['spots']}) | — | {r['reference_position_rms']:.4f} | "
        f"{r['reference_background_bias']:+.3f} | — |"
    )
    return "\n".join(lines)
