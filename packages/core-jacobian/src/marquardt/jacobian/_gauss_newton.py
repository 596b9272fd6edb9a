"""Gauss-Newton products without ``J``: strategy ``matrix_free``.

For residuals ``r(θ) ∈ ℝᴿ`` with Jacobian ``J = ∂r/∂θ``, a matrix-free LM step (Martens
2010, "Deep learning via Hessian-free optimization"; Schraudolph 2002, "Fast curvature
matrix-vector products") needs only

* ``Jᵀr`` and ``‖r‖²`` once per step: one vector-Jacobian product (reverse mode) per slice;
* ``JᵀJv`` for each conjugate-gradient iteration: per slice one Jacobian-vector product
  ``J_s v`` (forward mode, ``torch.func.jvp``) and one vector-Jacobian product
  ``J_sᵀ(J_s v)`` (reverse mode, ``torch.func.vjp``), summed over the slices;
* the same products from a subsample ``S`` of the samples (Martens 2010's curvature
  mini-batch): ``(N/|S|)·J_SᵀJ_S v``, whose expectation over uniform draws without
  replacement is ``JᵀJv`` (each sample is in ``S`` with probability ``|S|/N``), exact when
  ``S`` is every sample (``GaussNewtonProducts.use_samples``);
* for a subsample small enough that its rows of ``J`` take at most
  ``EXPLICIT_CURVATURE_BYTES`` (``explicit_samples``), ``J_S`` itself, formed once by the
  engine's fastest Jacobian mode: every later product is then two matrix products
  ``J_Sᵀ(J_S v)``, far cheaper than a ``jvp`` and a ``vjp`` through the model;
* ``k`` products at once, ``JᵀJV`` for a block ``V`` (k × P), by one ``vmap`` over the
  tangents of the ``jvp`` and the cotangents of the ``vjp`` (a randomized sketch);
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

__all__ = [
    "EXPLICIT_CURVATURE_BYTES",
    "GaussNewtonProducts",
    "gauss_newton_products",
    "probe_signs",
]

#: The most bytes a curvature subsample's rows of ``J`` may take to be formed explicitly.
EXPLICIT_CURVATURE_BYTES = 256 << 20

BlockProduct = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def probe_signs(rows: torch.Tensor, seed: int, probe: int) -> torch.Tensor:
    """±1 for each global row index in ``rows`` (int64), a fixed hash of (row, seed,
    probe): the same row gets the same sign wherever it is evaluated."""
    h = (rows * 0x9E3779B1 + (seed * 0x85EBCA77 + probe * 0xC2B2AE3D)) & 0xFFFFFFFF
    h = h ^ (h >> 15)
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h = h ^ (h >> 12)
    return 1 - 2 * ((h >> 7) & 1)


def _residual_of(
    replica: Replica, residual_fn: AnyResidual, inputs: torch.Tensor, targets: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``θ ↦ r`` (the residual rows of the samples ``inputs``, sample-major, on the
    replica's device) as a function of the flat θ."""
    x = to_device(inputs, replica.device)
    y = to_device(targets, replica.device)
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

    ``use_samples(index)`` makes every later product one of the samples ``index`` only,
    scaled by ``N/|index|`` (``Jᵀr``, ``rss`` and the probes stay the whole batch's).

    Arguments:
        jtr: ``Jᵀr`` (P,), float64 on ``devices[0]``.
        jtz: the probes' ``Jᵀz`` (probes × P), float64 on ``devices[0]``.
        rss: ``rᵀr``.
        rows: ``R``, the number of residual rows.
        _product: the function ``(V, index) ↦ JᵀJVᵀ`` (V: k × P; index: the samples, None
            for all) that ``product`` and ``block`` call and time.
        samples: ``N``, the samples of the batch (0: unknown, no subsample can be drawn).
        products: how many products ``JᵀJv`` have been formed (a block of k counts k).
        timings: seconds spent: ``jacobian`` (the ``Jᵀr`` pass), ``products`` (all
            ``JᵀJv`` so far).
        _index: the samples the products use (None: all; set by ``use_samples``).
        _jacobian_of: the rows of ``J`` of the samples of an index (None: products only).
        explicit_samples: the most samples whose rows of ``J`` ``use_samples`` forms
            explicitly (0: never).
        _rows: the subsample's rows of ``J``, when formed.
    """

    jtr: torch.Tensor
    jtz: torch.Tensor
    rss: float
    rows: int
    _product: BlockProduct = field(repr=False)
    samples: int = 0
    products: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    _index: torch.Tensor | None = field(default=None, repr=False)
    _jacobian_of: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False)
    explicit_samples: int = 0
    _rows: torch.Tensor | None = field(default=None, repr=False)

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

    @property
    def curvature_samples(self) -> int:
        """How many samples each product is formed from (``samples`` when all)."""
        return self.samples if self._index is None else int(self._index.numel())

    def use_samples(self, index: torch.Tensor | None) -> None:
        """Form every later product from the samples ``index`` only (int64, distinct, in
        ``[0, samples)``), scaled by ``N/|index|``; None: from every sample. Where the
        subsample holds at most ``explicit_samples``, its rows of ``J`` are formed here."""
        self._index = None if index is None else index.to(torch.int64).cpu()
        self._rows = None
        if (
            self._index is not None
            and self._jacobian_of is not None
            and self._index.numel() <= self.explicit_samples
        ):
            t = time.perf_counter()
            self._rows = self._jacobian_of(self._index).to(self.jtr.device)
            spent = time.perf_counter() - t
            self.timings["products"] = self.timings.get("products", 0.0) + spent

    def product(self, v: torch.Tensor) -> torch.Tensor:
        """``JᵀJv`` for ``v`` (P,), float64 on ``devices[0]`` (of the subsample, scaled,
        after ``use_samples``)."""
        return self.block(v.reshape(1, -1)).reshape(-1)

    def block(self, vs: torch.Tensor) -> torch.Tensor:
        """``JᵀJv`` for each row ``v`` of ``vs`` (k × P), as rows (k × P, float64)."""
        t = time.perf_counter()
        if self._rows is not None:
            rows = self._rows
            # (JVᵀ)ᵀJ: the k × P result laid out as rows, as the callers read it.
            out = ((rows @ vs.T.to(rows.dtype)).T @ rows).double()
        else:
            out = self._product(vs, self._index)
        if self._index is not None:
            out = out * (self.samples / max(1, int(self._index.numel())))
        self.products += int(vs.shape[0])
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


def _product_chunks(
    chunks: list[tuple[int, int]], per_chunk: int, index: torch.Tensor | None, k: int
) -> list[tuple[int, int, torch.Tensor | None]]:
    """The chunks of a product of ``k`` tangents: the batch's ``chunks``, or those of the
    subsample ``index`` (``per_chunk`` samples each, fewer chunks), each cut ``k`` times
    smaller (k tangents at once hold k times the activations); with the subsample's
    indices of each (None for the whole batch)."""
    ranges: list[tuple[int, int, torch.Tensor | None]]
    if index is None:
        ranges = [(lo, hi, None) for lo, hi in chunks]
    else:
        step = max(1, per_chunk)
        ranges = [(lo, hi, index[lo:hi]) for lo, hi in slice_ranges(len(index), step)]
    return [
        (lo + a, lo + b, None if at is None else at[a:b])
        for lo, hi, at in ranges
        for a, b in slice_ranges(hi - lo, max(1, (hi - lo) // k) if k > 1 else hi - lo)
    ]


def gauss_newton_products(
    replicas: Replicas,
    residual_fn: AnyResidual,
    workers: DeviceWorkers,
    batch: PreparedBatch,
    *,
    probes: int,
    seed: int,
    row_offset: int = 0,
    jacobian_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> GaussNewtonProducts:
    """``Jᵀr``, ``rᵀr``, the diagonal estimate and the ``JᵀJv`` operator of ``batch``.

    ``probes`` ±1 vectors estimate ``diag(JᵀJ)`` (0: none); their signs
    come from ``seed`` and the global row index (``row_offset`` + the local row).
    ``jacobian_of`` forms the rows of ``J`` of a subsample (None: products only). Raises
    ``ResidualNotFiniteError`` when a residual is NaN or infinite.
    """
    home = replicas.devices[0]
    m = batch.plan.outputs_per_sample
    chunks = _chunks(batch)
    params = replicas.num_params

    def gradient_job(lo: int, hi: int) -> Callable[[int], torch.Tensor]:
        def job(dev: int) -> torch.Tensor:
            replica = replicas[dev]
            fn = _residual_of(replica, residual_fn, batch.inputs[lo:hi], batch.targets[lo:hi])
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

    def product(vs: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
        k = int(vs.shape[0])
        split = _product_chunks(chunks, batch.plan.samples_per_chunk, index, k)

        def job_of(lo: int, hi: int, at: torch.Tensor | None) -> Callable[[int], torch.Tensor]:
            def job(dev: int) -> torch.Tensor:
                replica = replicas[dev]
                x = batch.inputs[lo:hi] if at is None else batch.inputs[at]
                y = batch.targets[lo:hi] if at is None else batch.targets[at]
                fn = _residual_of(replica, residual_fn, x, y)
                flat = replica.flat.detach()
                tangents = vs.to(replica.device, flat.dtype)
                with torch.enable_grad():
                    _, pullback = _pullback(fn, flat)
                    if k == 1:
                        jv = jvp(fn, (flat,), (tangents[0],))[1].unsqueeze(0)
                    else:
                        jv = vmap(lambda t: jvp(fn, (flat,), (t,))[1])(tangents)
                if k == 1:
                    return pullback(jv[0].detach()).double().unsqueeze(0)
                return vmap(pullback)(jv.detach()).double()

            return job

        return _summed(workers, [job_of(lo, hi, at) for lo, hi, at in split], home)

    return GaussNewtonProducts(
        jtr=jtr,
        jtz=jtz,
        rss=rss,
        rows=batch.rows,
        _product=product,
        samples=batch.samples,
        _jacobian_of=jacobian_of,
        explicit_samples=EXPLICIT_CURVATURE_BYTES // max(1, m * params * replicas.dtype.itemsize)
        if jacobian_of is not None
        else 0,
        timings={"jacobian": time.perf_counter() - t0, "products": 0.0},
    )
