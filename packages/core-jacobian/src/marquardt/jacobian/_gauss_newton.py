"""Gauss-Newton products without ``J``: strategy ``matrix_free``.

For residuals ``r(θ) ∈ ℝᴿ`` with Jacobian ``J = ∂r/∂θ``, a matrix-free LM step (Martens
2010, "Deep learning via Hessian-free optimization"; Schraudolph 2002, "Fast curvature
matrix-vector products") needs only

* ``Jᵀr`` and ``‖r‖²`` once per step: one vector-Jacobian product (reverse mode) per slice;
* ``JᵀJv`` for each conjugate-gradient iteration: per slice one Jacobian-vector product
  ``J_s v`` (forward mode, ``torch.func.jvp``) and one vector-Jacobian product
  ``J_sᵀ(J_s v)`` (reverse mode, ``torch.func.vjp``), summed over the slices;
* an estimate of ``diag(JᵀJ)`` for the preconditioner and Marquardt's scaling, by
  Hutchinson's estimator (Bekas, Kokiopoulou & Saad 2007): ``E[(Jᵀz)∘(Jᵀz)] = diag(JᵀJ)``
  for ``z`` with independent ±1 entries. Each probe is one more reverse pass over the
  graph of the ``Jᵀr`` pass. The entries of ``z`` are a hash of the *global* row index,
  the step's seed and the probe, so the estimate does not depend on how the batch is cut
  into slices, devices or ranks (``row_offset`` places a rank's rows in the global batch).

No slice ever holds more than its chunk's activations and a few ``P``-vectors: memory
grows with ``P`` and the chunk size, never with ``P²`` or ``R·P``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.func import functional_call, jvp, vjp, vmap

from ._modes._common import rows_of
from ._points import AnyResidual, PointResidual
from ._prepared import PreparedBatch
from ._replicas import Replica, Replicas
from ._slicing import DeviceWorkers, slice_ranges, to_device
from ._validate import check_finite_residuals

__all__ = ["GaussNewtonProducts", "gauss_newton_products", "probe_signs"]

Product = Callable[[torch.Tensor], torch.Tensor]


def probe_signs(rows: torch.Tensor, seed: int, probe: int) -> torch.Tensor:
    """±1 for each global row index in ``rows`` (int64), a fixed hash of (row, seed,
    probe): the same row gets the same sign wherever it is evaluated."""
    h = (rows * 0x9E3779B1 + (seed * 0x85EBCA77 + probe * 0xC2B2AE3D)) & 0xFFFFFFFF
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h = h ^ (h >> 12)
    return 1 - 2 * ((h >> 7) & 1)


def _residual_of(
    replica: Replica, residual_fn: AnyResidual, batch: PreparedBatch, lo: int, hi: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``θ ↦ r`` (the residual rows of samples ``[lo, hi)`` of the batch, sample-major, on
    the replica's device) as a function of the flat θ."""
    x = to_device(batch.inputs[lo:hi], replica.device)
    y = to_device(batch.targets[lo:hi], replica.device)
    b = int(x.shape[0])
    if isinstance(residual_fn, PointResidual):
        return lambda flat: residual_fn.rows(
            replica.module, replica.param_dict(flat), x, y
        ).reshape(-1)
    return lambda flat: rows_of(
        residual_fn(functional_call(replica.module, replica.param_dict(flat), (x,)), y), b
    ).reshape(-1)


def _pullback(
    fn: Callable[[torch.Tensor], torch.Tensor], flat: torch.Tensor
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """``(r, u ↦ Jᵀu)`` of ``fn`` at ``flat`` (``torch.func.vjp``; callable many times)."""
    out = vjp(fn, flat)
    pull = out[1]
    return out[0], lambda u: pull(u)[0]


@dataclass
class GaussNewtonProducts:
    """One step's products of a batch prepared for ``matrix_free``.

    Sums over ranks add ``jtr``, ``jtz``, ``rss`` and ``rows`` before ``diagonal()``
    squares. ``product(v)`` is ``JᵀJv`` (float64 on ``devices[0]``), formed slice by slice
    from one ``jvp`` and one ``vjp`` each, without ``J``.

    Arguments:
        jtr: ``Jᵀr`` (P,), float64 on ``devices[0]``.
        jtz: the probes' ``Jᵀz`` (probes × P), float64 on ``devices[0]``.
        rss: ``rᵀr``.
        rows: ``R``, the number of residual rows.
        _product: the function ``v ↦ JᵀJv`` that ``product`` calls and times.
        products: how many times ``product`` has been called.
        timings: seconds spent: ``jacobian`` (the ``Jᵀr`` pass), ``products`` (all
            ``JᵀJv`` so far).
    """

    jtr: torch.Tensor
    jtz: torch.Tensor
    rss: float
    rows: int
    _product: Product = field(repr=False)
    products: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def probes(self) -> int:
        """How many Hutchinson probes ``jtz`` holds."""
        return int(self.jtz.shape[0])

    def diagonal(self) -> torch.Tensor:
        """The estimate of ``diag(JᵀJ)``: the mean over probes of ``(Jᵀz)∘(Jᵀz)`` (zeros
        without probes)."""
        if self.probes == 0:
            return torch.zeros_like(self.jtr)
        return self.jtz.pow(2).mean(0)

    def product(self, v: torch.Tensor) -> torch.Tensor:
        """``JᵀJv`` for ``v`` (P,), float64 on ``devices[0]``."""
        t = time.perf_counter()
        out = self._product(v)
        self.products += 1
        self.timings["products"] = self.timings.get("products", 0.0) + time.perf_counter() - t
        return out


def _chunks(batch: PreparedBatch) -> list[tuple[int, int]]:
    """Sample ranges of at most one planned chunk, within the batch's slices."""
    step = max(1, batch.plan.samples_per_chunk)
    out: list[tuple[int, int]] = []
    for lo, hi in batch.slices():
        out.extend((lo + a, lo + b) for a, b in slice_ranges(hi - lo, step))
    return out


def _summed(
    workers: DeviceWorkers,
    jobs: list[Callable[[int], torch.Tensor]],
    home: torch.device,
) -> torch.Tensor:
    """The sum of the jobs' float64 results on ``home``, added as they arrive."""
    total: torch.Tensor | None = None
    for part in workers.map_ordered(jobs):
        part = part.to(home)
        total = part if total is None else total.add_(part)
    assert total is not None
    return total


def gauss_newton_products(
    replicas: Replicas,
    residual_fn: AnyResidual,
    workers: DeviceWorkers,
    batch: PreparedBatch,
    *,
    probes: int,
    seed: int,
    row_offset: int = 0,
) -> GaussNewtonProducts:
    """``Jᵀr``, ``rᵀr``, the diagonal estimate and the ``JᵀJv`` operator of ``batch``.

    ``probes`` ±1 vectors estimate ``diag(JᵀJ)`` (0: none); their signs
    come from ``seed`` and the global row index (``row_offset`` + the local row). Raises
    ``ResidualNotFiniteError`` when a residual is NaN or infinite.
    """
    home = replicas.devices[0]
    m = batch.plan.outputs_per_sample
    chunks = _chunks(batch)
    params = replicas.num_params

    def gradient_job(lo: int, hi: int) -> Callable[[int], torch.Tensor]:
        def job(dev: int) -> torch.Tensor:
            replica = replicas[dev]
            fn = _residual_of(replica, residual_fn, batch, lo, hi)
            with torch.enable_grad():
                r, pullback = _pullback(fn, replica.flat.detach())
            r = r.detach()
            check_finite_residuals(r.reshape(hi - lo, -1), m, lo)
            parts = [pullback(r).double()]
            if probes:
                rows = torch.arange(lo * m, hi * m, device=replica.device) + row_offset * m
                signs = torch.stack([probe_signs(rows, seed, k) for k in range(probes)])
                # Jᵀz of every probe at once: one batched reverse pass over the same graph.
                parts.append(vmap(pullback)(signs.to(r.dtype)).double().reshape(-1))
            parts.append(r.double().pow(2).sum().reshape(1))
            return torch.cat(parts)

        return job

    t0 = time.perf_counter()
    summed = _summed(workers, [gradient_job(lo, hi) for lo, hi in chunks], home)
    jtr = summed[:params]
    jtz = summed[params:-1].reshape(probes, params)
    rss = float(summed[-1])

    def product(v: torch.Tensor) -> torch.Tensor:
        def job_of(lo: int, hi: int) -> Callable[[int], torch.Tensor]:
            def job(dev: int) -> torch.Tensor:
                replica = replicas[dev]
                fn = _residual_of(replica, residual_fn, batch, lo, hi)
                flat = replica.flat.detach()
                tangent = v.to(replica.device, flat.dtype)
                with torch.enable_grad():
                    jv = jvp(fn, (flat,), (tangent,))[1]
                    _, pullback = _pullback(fn, flat)
                return pullback(jv.detach()).double()

            return job

        return _summed(workers, [job_of(lo, hi) for lo, hi in chunks], home)

    return GaussNewtonProducts(
        jtr=jtr,
        jtz=jtz,
        rss=rss,
        rows=batch.rows,
        _product=product,
        timings={"jacobian": time.perf_counter() - t0, "products": 0.0},
    )
