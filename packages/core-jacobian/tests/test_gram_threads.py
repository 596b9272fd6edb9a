"""The threaded Gram kernel: NumPy's ``syrk`` on row pieces, against ``JᵀJ`` in float64,
the fixed rule that chooses it, and its pool in a forked child."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from marquardt.jacobian import JacobianEngine, Replicas, _gram_threads
from marquardt.jacobian._gram import (
    NUMPY_FROM_PARAMS,
    THREADS_FROM_PARAMS,
    GramAccumulator,
    choose_kernel,
)
from marquardt.testing.threads import torch_threads

pytest.importorskip("numpy")
pytest.importorskip("threadpoolctl")

CPU = torch.device("cpu")
ROWS = 2 * _gram_threads.MIN_PIECE_ROWS


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("MARQUARDT_JACOBIAN_GRAM_KERNEL", raising=False)
    with torch_threads(2):
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pieces", [1, 2, 3])
def test_pieces_give_the_gram_product(dtype: torch.dtype, pieces: int) -> None:
    gen = torch.Generator().manual_seed(pieces)
    buffers = _gram_threads.PieceBuffers(40, dtype)
    # Twice with the same buffers: each call's products, not a running sum.
    for rows in (3001, 2500):
        jac = torch.randn(rows, 40, generator=gen, dtype=dtype)
        res = torch.randn(rows, generator=gen, dtype=dtype)
        jtj, jtr = _gram_threads.gram_pieces(jac, res, pieces, buffers)
        j64, r64 = jac.double(), res.double()
        tol = 1e-12 if dtype == torch.float64 else 2e-4
        torch.testing.assert_close(jtj.double(), j64.T @ j64, rtol=tol, atol=tol * rows)
        torch.testing.assert_close(jtr.double(), j64.T @ r64, rtol=tol, atol=tol * rows)
        assert jtj.dtype == dtype and jtr.dtype == dtype
        assert torch.equal(jtj, jtj.T)


def test_the_rule_is_fixed_on_shape_and_threads(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = THREADS_FROM_PARAMS
    assert choose_kernel(CPU, p, ROWS) == "numpy-threads"
    assert choose_kernel(CPU, NUMPY_FROM_PARAMS - 1, ROWS) == "numpy-threads"
    assert choose_kernel(CPU, p - 1, ROWS) == "torch"  # too narrow
    assert choose_kernel(CPU, p, ROWS - 1) == "torch"  # too few rows for two pieces
    assert choose_kernel(CPU, NUMPY_FROM_PARAMS, ROWS) == "numpy"  # P × P temporaries
    assert choose_kernel(CPU, p, ROWS, torch.bfloat16) == "torch"  # NumPy has no bfloat16
    assert GramAccumulator(p, CPU, torch.float32, ROWS).kernel == "numpy-threads"
    with torch_threads(1):
        assert choose_kernel(CPU, p, ROWS) == "torch"
    monkeypatch.setenv("MARQUARDT_JACOBIAN_GRAM_KERNEL", "numpy-threads")
    assert choose_kernel(CPU, 3, 10) == "numpy-threads"
    monkeypatch.setattr(_gram_threads, "available", lambda: False)
    assert choose_kernel(CPU, 3, 10) == "numpy"
    monkeypatch.delenv("MARQUARDT_JACOBIAN_GRAM_KERNEL")
    assert choose_kernel(CPU, p, ROWS) == "torch"


def _mlp_problem() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 128), nn.Tanh(), nn.Linear(128, 1)).double()
    x = torch.linspace(-1, 1, 2500, dtype=torch.float64)[:, None]
    return model, x, torch.sin(3 * x)


def test_accumulate_with_the_threaded_kernel_matches_the_jacobian(two_threads: None) -> None:
    model, x, y = _mlp_problem()  # P = 385, 2,500 rows: the threaded kernel
    engine = JacobianEngine(Replicas(model, ["cpu"]), lambda out, t: out - t)
    products = engine.accumulate(x, y)
    jac, res = engine.jacobian(x, y)
    assert choose_kernel(CPU, jac.shape[1], jac.shape[0], torch.float64) == "numpy-threads"
    torch.testing.assert_close(products.jtj, jac.T @ jac, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(products.jtr, jac.T @ res, rtol=1e-12, atol=1e-10)
    assert products.rss == pytest.approx(float(res @ res), rel=1e-12)


def _in_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    # Checked in NumPy: torch's own parallel kernels may not run in a child forked after
    # the parent ran one (its OpenMP pool is the parent's), whatever this kernel does.
    jac = torch.arange(6000.0, dtype=torch.float64).reshape(2000, 3) / 1000
    ones = torch.ones(2000, dtype=torch.float64)
    jtj, _ = _gram_threads.gram_pieces(jac, ones, 2, _gram_threads.PieceBuffers(3, jac.dtype))
    a = jac.numpy()
    queue.put(float(abs(jtj.numpy() - a.T @ a).max()))


def test_a_forked_child_gets_a_pool_of_its_own() -> None:
    # The parent's pool threads do not exist in a forked child: reusing the pool there
    # would wait for ever.
    jac = torch.ones(2000, 3, dtype=torch.float64)
    ones = torch.ones(2000, dtype=torch.float64)
    _gram_threads.gram_pieces(jac, ones, 2, _gram_threads.PieceBuffers(3, jac.dtype))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(queue,))
    child.start()
    child.join(timeout=30)
    if child.is_alive():
        child.kill()
        pytest.fail("the threaded Gram kernel hung in a forked child")
    assert child.exitcode == 0
    assert queue.get(timeout=5) < 1e-9


def _spin_holders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "marquardt-openmp-spin"]


@pytest.mark.parametrize("fails", [False, True])
def test_the_short_spin_ends_soon_after_its_last_block(
    fails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One holder thread (and its OpenMP team) serves consecutive blocks, even ones that
    # raise, and ends HOLD_SECONDS after the last: left alive, the short spin would slow
    # every later torch kernel of the process.
    monkeypatch.setattr(_gram_threads, "HOLD_SECONDS", 0.2)
    holders = []
    for _ in range(3):
        with contextlib.suppress(ZeroDivisionError), _gram_threads.short_openmp_spin():
            holders += _spin_holders()
            if fails:
                _ = 1 / 0
    assert len(holders) == 3 and len(set(holders)) == 1
    assert holders[0].is_alive()  # held a while after the block
    holders[0].join(timeout=10)
    assert not holders[0].is_alive()
    assert _spin_holders() == []
    with _gram_threads.short_openmp_spin(active=False):
        assert _spin_holders() == []


def test_an_accumulation_leaves_no_thread_behind(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x, y = _mlp_problem()
    engine = JacobianEngine(Replicas(model, ["cpu"]), lambda out, t: out - t)
    before = {t.name for t in threading.enumerate()}
    seen: list[int] = []
    real_add = GramAccumulator.add

    def add(self: GramAccumulator, jac: torch.Tensor, res: torch.Tensor) -> None:
        seen.append(len(_spin_holders()))
        real_add(self, jac, res)

    monkeypatch.setattr(GramAccumulator, "add", add)
    monkeypatch.setattr(_gram_threads, "HOLD_SECONDS", 0.2)
    engine.accumulate(x, y)
    assert seen == [1]  # the short spin held while the threaded kernel ran
    for holder in _spin_holders():
        holder.join(timeout=10)
    assert {t.name for t in threading.enumerate()} - before <= {
        f"marquardt-gram_{i}" for i in range(8)
    }
