"""curve_fit_batch: every fit of a batch equals curve_fit on that fit alone.

The single fits get f's exact Jacobian (``jac``), so that both sides take the same LM
steps; pcov is SciPy's ``trf`` one on both sides (``method="trf"``).

Float64, 1e-8 relative, over the options that change a fit's path: σ per fit and
``absolute_sigma``, bounds with optima inside and on a bound, each robust loss, and points
dropped by ``nan_policy="omit"`` (fits of different lengths). Then the per-fit status
(converged, out of evaluations, non-finite) with the other fits undisturbed, chunks of a
batch against one chunk, the shapes, the types returned, and bad input refused before f
is ever run.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from marquardt.solver import OptimizeWarning, curve_fit, curve_fit_batch
from marquardt.solver._curve.batch.curve_fit_batch import chunk_fits
from marquardt.testing.curves import decay

RTOL = 1e-8
FITS = 12
X = np.linspace(0.0, 4.0, 40)


def gauss2d(
    xy: torch.Tensor, a: object, x0: object, y0: object, w: object, b: object
) -> torch.Tensor:
    r2 = (xy[0] - x0) ** 2 + (xy[1] - y0) ** 2  # type: ignore[operator]
    return a * torch.exp(-0.5 * r2 / w**2) + b  # type: ignore[operator]


def _truth(fits: int = FITS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    true = np.c_[rng.uniform(1, 3, fits), rng.uniform(0.5, 2, fits), rng.uniform(-1, 1, fits)]
    y = true[:, :1] * np.exp(-true[:, 1:2] * X) + true[:, 2:]
    return true, y + 0.05 * rng.standard_normal(y.shape)


def _single(
    f: object, x: np.ndarray, y: np.ndarray, p0: object, **kw: object
) -> tuple[np.ndarray, np.ndarray]:
    """curve_fit on one fit with f's exact Jacobian (``jac``): the single-fit path taking
    the steps the batch takes (a torch model alone gets finite-difference steps, which
    move the optimum it finds by up to ~1e-8 relative)."""
    xt = torch.from_numpy(np.ascontiguousarray(x))

    def values(_: object, *p: float) -> np.ndarray:
        return f(xt, *torch.tensor(p, dtype=torch.float64)).numpy()  # type: ignore[operator]

    def jac(_: object, *p: float) -> np.ndarray:
        one = lambda q: f(xt, *q.unbind())  # type: ignore[operator]  # noqa: E731
        return torch.func.jacfwd(one)(torch.tensor(p, dtype=torch.float64)).numpy()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        popt, pcov = curve_fit(values, x, y, p0, jac=jac, method="trf", **kw)  # type: ignore[arg-type]
    return popt, pcov


def _assert_each(
    popt: np.ndarray, pcov: np.ndarray, singles: list[tuple[np.ndarray, np.ndarray]]
) -> None:
    for m, (p1, c1) in enumerate(singles):
        np.testing.assert_allclose(popt[m], p1, rtol=RTOL, atol=1e-12, err_msg=f"fit {m}")
        np.testing.assert_allclose(
            pcov[m], c1, rtol=1e-6, atol=1e-8 * np.abs(c1).max(), err_msg=f"fit {m}"
        )


def test_each_fit_equals_curve_fit_with_sigma_per_fit() -> None:
    _, y = _truth()
    sigma = np.random.default_rng(1).uniform(0.02, 0.1, y.shape)
    for absolute in (False, True):
        popt, pcov = curve_fit_batch(
            decay, X, y, [1.0, 1.0, 0.0], sigma=sigma, absolute_sigma=absolute
        )
        singles = [
            _single(decay, X, y[m], [1.0, 1.0, 0.0], sigma=sigma[m], absolute_sigma=absolute)
            for m in range(FITS)
        ]
        _assert_each(popt, pcov, singles)


def test_each_fit_equals_curve_fit_with_bounds_inside_and_active() -> None:
    _, y = _truth()
    # The offset is held at 0.2 for fits whose true offset lies below it.
    lower = np.array([0.0, 0.0, 0.2])
    upper = np.array([10.0, 5.0, 2.0])
    popt, pcov = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.5], bounds=(lower, upper))
    singles = [_single(decay, X, y[m], [1.0, 1.0, 0.5], bounds=(lower, upper)) for m in range(FITS)]
    assert np.any(popt[:, 2] == 0.2) and np.any(popt[:, 2] > 0.2)
    _assert_each(popt, pcov, singles)


@pytest.mark.parametrize("loss", ["soft_l1", "huber", "cauchy", "arctan"])
def test_each_fit_equals_curve_fit_with_a_robust_loss(loss: str) -> None:
    _, y = _truth()
    y[:, ::7] += 2.0  # outliers
    popt, pcov = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0], loss=loss, f_scale=0.1)
    singles = [
        _single(decay, X, y[m], [1.0, 1.0, 0.0], loss=loss, f_scale=0.1) for m in range(FITS)
    ]
    _assert_each(popt, pcov, singles)


def test_losses_and_bounds_per_fit() -> None:
    _, y = _truth()
    losses = ["linear", "cauchy"] * (FITS // 2)
    lower = np.tile([0.0, 0.0, -2.0], (FITS, 1))
    lower[::3, 2] = 0.3
    popt, _ = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.5], bounds=(lower, np.inf), loss=losses)
    for m in range(FITS):
        p1, _ = _single(decay, X, y[m], [1.0, 1.0, 0.5], bounds=(lower[m], np.inf), loss=losses[m])
        np.testing.assert_allclose(popt[m], p1, rtol=RTOL, atol=1e-12)


def test_nan_points_omitted_per_fit() -> None:
    _, y = _truth()
    rng = np.random.default_rng(2)
    for m in range(FITS):
        y[m, rng.choice(X.size, size=m, replace=False)] = np.nan
    with pytest.raises(ValueError, match=r"HINT: .*nan_policy=.omit."):
        curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0])
    popt, pcov = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0], nan_policy="omit")
    singles = []
    for m in range(FITS):
        keep = np.isfinite(y[m])
        singles.append(_single(decay, X[keep], y[m, keep], [1.0, 1.0, 0.0]))
    _assert_each(popt, pcov, singles)


def test_two_dimensional_x_shared_and_per_fit() -> None:
    grid = np.stack(np.meshgrid(np.arange(5.0), np.arange(5.0), indexing="ij")).reshape(2, 25)
    rng = np.random.default_rng(3)
    true = np.c_[
        rng.uniform(50, 100, FITS),
        rng.uniform(1.5, 2.5, (FITS, 2)),
        rng.uniform(0.8, 1.2, FITS),
        rng.uniform(5, 10, FITS),
    ]
    xt = torch.from_numpy(grid)
    y = np.stack([gauss2d(xt, *torch.from_numpy(t)).numpy() for t in true])
    y = rng.poisson(y).astype(np.float64)
    p0 = np.c_[y.max(1) - y.min(1), np.full((FITS, 2), 2.0), np.ones(FITS), y.min(1)]
    shared = curve_fit_batch(gauss2d, grid, y, p0)
    per_fit = curve_fit_batch(gauss2d, np.broadcast_to(grid, (FITS, 2, 25)), y, p0)
    np.testing.assert_allclose(shared[0], per_fit[0], rtol=1e-12)
    for m in range(FITS):
        p1, _ = _single(gauss2d, grid, y[m], p0[m])
        np.testing.assert_allclose(shared[0][m], p1, rtol=RTOL)


def test_status_marks_each_fit_and_failures_do_not_disturb_the_others() -> None:
    _, y = _truth()
    clean, _, info_clean = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0], full_output=True)
    bad = y.copy()
    p0 = np.tile([1.0, 1.0, 0.0], (FITS, 1))
    p0[3] = [1.0, -400.0, 0.0]  # exp(400·x) overflows: f is inf at the start
    bad[5] = 1e6 * np.sin(40 * X)  # a fit that needs 37 evaluations
    with pytest.warns(OptimizeWarning, match="2 of 12 fits did not converge"):
        popt, _, info = curve_fit_batch(decay, X, bad, p0, full_output=True, max_nfev=20)
    status = info["status"]
    assert status[3] == -2 and status[5] == 0
    assert set(info_clean["status"].tolist()) <= {1, 2, 3, 4}
    others = [m for m in range(FITS) if m not in (3, 5)]
    assert set(info["status"][others].tolist()) <= {1, 2, 3, 4}
    np.testing.assert_allclose(popt[others], clean[others], rtol=1e-13)
    np.testing.assert_array_equal(info["nfev"][others], info_clean["nfev"][others])
    np.testing.assert_array_equal(popt[3], p0[3])
    assert info["nfev"][5] == 20 and info["nfev"][3] == 1


def test_chunks_give_the_results_of_one_chunk() -> None:
    _, y = _truth(fits=37)
    whole = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0], full_output=True)
    for size in (1, 5, 36):
        parts = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0], full_output=True, chunk_size=size)
        np.testing.assert_allclose(parts[0], whole[0], rtol=1e-13)
        np.testing.assert_allclose(parts[1], whole[1], rtol=1e-13)
        np.testing.assert_array_equal(parts[2]["status"], whole[2]["status"])


def test_chunk_size_from_memory_is_bounded() -> None:
    size = chunk_fits(10**7, 25, 5, 0, 8, torch.device("cpu"))
    assert 1 <= size < 10**7


def test_torch_in_torch_out_numpy_in_numpy_out() -> None:
    _, y = _truth()
    popt, pcov = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0])
    assert isinstance(popt, np.ndarray) and popt.shape == (FITS, 3) and pcov.shape == (FITS, 3, 3)
    popt_t, _ = curve_fit_batch(
        decay, torch.from_numpy(X), torch.from_numpy(y), torch.tensor([1.0, 1.0, 0.0])
    )
    assert isinstance(popt_t, torch.Tensor) and popt_t.dtype == torch.float64
    np.testing.assert_allclose(popt_t.numpy(), popt, rtol=1e-12)
    p32, _ = curve_fit_batch(
        decay, torch.from_numpy(X).float(), torch.from_numpy(y).float(), [1.0, 1.0, 0.0]
    )
    assert p32.dtype == torch.float32
    np.testing.assert_allclose(p32.numpy(), popt, rtol=1e-3)


class _Calls:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.count += 1
        return a * x + b


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"ydata": np.ones(40)}, "ydata must be \\(M, N\\)"),
        ({"xdata": np.ones(39)}, "xdata has shape"),
        ({"p0": np.ones((5, 2))}, "`p0` has shape"),
        ({"sigma": -np.ones(40)}, "`sigma` must be positive"),
        ({"bounds": (1.0, 0.0)}, "strictly less"),
        ({"loss": "square"}, "`loss` must be one of"),
        ({"nan_policy": "propagate"}, "nan_policy must be"),
    ],
)
def test_bad_input_refused_before_f_runs(change: dict[str, object], match: str) -> None:
    f = _Calls()
    kw: dict[str, object] = {"xdata": X, "ydata": np.ones((4, 40)), "p0": [0.5, 0.5]}
    kw.update(change)
    with pytest.raises(ValueError, match=match) as caught:
        curve_fit_batch(f, **kw)  # type: ignore[arg-type]
    assert "HINT:" in str(caught.value) and f.count == 0


def test_a_model_vmap_cannot_batch_is_refused_with_a_hint() -> None:
    def numpy_model(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.exp(-b.numpy() * x.numpy())) * a

    def branching(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * x if b > 0 else a * x + b

    for f in (numpy_model, branching):
        with pytest.raises(ValueError, match=r"torch\.func\.vmap.*HINT: write f"):
            curve_fit_batch(f, X, np.ones((3, 40)), [1.0, 1.0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batch_equals_cpu_batch() -> None:
    _, y = _truth(fits=200)
    cpu = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0], bounds=([0, 0, -2], [10, 5, 2]))
    yc = torch.from_numpy(y).cuda()
    gpu = curve_fit_batch(
        decay, torch.from_numpy(X).cuda(), yc, [1.0, 1.0, 0.0], bounds=([0, 0, -2], [10, 5, 2])
    )
    assert gpu[0].device.type == "cuda"
    # Sums in another order can flip a stopping test at its threshold: a tolerance's worth.
    np.testing.assert_allclose(gpu[0].cpu().numpy(), cpu[0], rtol=1e-7)
    np.testing.assert_allclose(gpu[1].cpu().numpy(), cpu[1], rtol=1e-5)


def test_chunks_follow_the_usable_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import marquardt.solver._curve.batch.curve_fit_batch as batch

    _, y = _truth(fits=23)
    whole = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0])
    # Room for about 8 fits' working sets: 3 chunks.
    per_fit = 8 * (16 * 40 * 3 + 24 * 40 + 4 * 9 + 16 * 3)
    monkeypatch.setattr(batch, "usable_memory", lambda device, limit: (16 * per_fit, "test"))
    assert batch.chunk_fits(23, 40, 3, 0, 8, torch.device("cpu")) == 8
    sizes: list[int] = []
    solve = batch.solve_batch
    monkeypatch.setattr(
        batch,
        "solve_batch",
        lambda model, p0, data, **kw: sizes.append(p0.shape[0]) or solve(model, p0, data, **kw),
    )
    parts = curve_fit_batch(decay, X, y, [1.0, 1.0, 0.0])
    assert sizes == [8, 8, 7]
    np.testing.assert_allclose(parts[0], whole[0], rtol=1e-13)


def test_per_fit_x_f_scale_and_the_feasible_start() -> None:
    _, y = _truth()
    shifts = np.linspace(0.0, 0.5, FITS)
    x = X[None, :] + shifts[:, None]  # (M, N): one x per fit
    scales = np.linspace(0.05, 0.5, FITS)
    popt, _ = curve_fit_batch(decay, x, y, [1.0, 1.0, 0.0], loss="soft_l1", f_scale=scales)
    for m in range(FITS):
        p1, _ = _single(decay, x[m], y[m], [1.0, 1.0, 0.0], loss="soft_l1", f_scale=scales[m])
        np.testing.assert_allclose(popt[m], p1, rtol=RTOL, atol=1e-12)
    bounds = ([0.0, 0.0, -2.0], [5.0, 3.0, 2.0])
    popt, _ = curve_fit_batch(decay, X, y, bounds=bounds)  # p0 None: SciPy's feasible start
    for m in range(FITS):
        p1, _ = _single(decay, X, y[m], [2.5, 1.5, 0.0], bounds=bounds)
        np.testing.assert_allclose(popt[m], p1, rtol=RTOL, atol=1e-12)


def test_usable_memory_counts_torch_cached_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """After large tensors are freed, the driver reports little free memory while torch's
    allocator holds the rest for reuse: a step is sized on both (0.8 × 68 GiB here)."""
    from marquardt.solver._lm.memory_fit import usable_memory

    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 64 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 4 * gib)
    usable, source = usable_memory(torch.device("cuda", 0), None)
    assert usable == int(0.8 * 68 * gib)
    assert source == "free memory of cuda:0 + 60.00 GiB cached by torch x 0.8"
