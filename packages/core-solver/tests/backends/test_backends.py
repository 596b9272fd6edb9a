"""The NumPy and torch backends: assembly, damped solves, failures as ``None``."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import torch

from marquardt.jacobian import JacobianSlice, NormalProducts
from marquardt.solver import ArrayBackend, LinearSystem
from marquardt.solver._backends.base import Solution
from marquardt.solver._backends.numpy_backend import NumpyBackend, cholesky_solve_numpy
from marquardt.solver._backends.systems import host_vector, read_values
from marquardt.solver._backends.torch_backend import TorchBackend

BACKENDS = [NumpyBackend(), TorchBackend("cpu")]
IDS = ["numpy", "torch"]


def _problem(rows: int, params: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    jac = torch.randn(rows, params, generator=g, dtype=torch.float64)
    res = torch.randn(rows, generator=g, dtype=torch.float64)
    return jac, res


def _slices(jac: torch.Tensor, res: torch.Tensor, size: int) -> list[JacobianSlice]:
    out = []
    for lo in range(0, jac.shape[0], size):
        hi = min(lo + size, jac.shape[0])
        out.append(JacobianSlice(lo, hi, jac[lo:hi].clone(), res[lo:hi].clone()))
    return out[::-1]  # any order must do


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_backends_satisfy_the_protocol(backend: ArrayBackend) -> None:
    assert isinstance(backend, ArrayBackend)


@pytest.mark.parametrize("scaling", ["identity", "marquardt"])
@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_overdetermined_solve_matches_the_formula(backend: ArrayBackend, scaling: str) -> None:
    jac, res = _problem(40, 5)
    n = 40
    lam = 0.3
    a = jac.T @ jac / n
    d = torch.diagonal(a) if scaling == "marquardt" else torch.ones(5, dtype=torch.float64)
    expected = torch.linalg.solve(a + lam * torch.diag(d), jac.T @ res / n)
    for system in (
        backend.system_from_slices(_slices(jac, res, 7), 40, 5),
        backend.system_from_products(
            NormalProducts(jtj=jac.T @ jac, jtr=jac.T @ res, rss=float(res @ res), rows=n)
        ),
    ):
        assert not system.underdetermined
        assert system.rss == pytest.approx(float(res @ res))
        np.testing.assert_allclose(host_vector(system.gradient), (jac.T @ res / n).numpy())
        solution = backend.solve(system, lam, scaling)
        assert solution is not None
        assert solution.delta.dtype == torch.float64 and solution.delta.device.type == "cpu"
        torch.testing.assert_close(solution.delta, expected, rtol=1e-10, atol=1e-12)
        # The predicted reduction is exact for the linear model.
        delta = solution.delta
        actual = (float(res @ res) - float((res - jac @ delta) @ (res - jac @ delta))) / n
        assert solution.predicted_reduction(1.0) == pytest.approx(actual, rel=1e-9)
        half = 0.5 * delta
        actual_half = (float(res @ res) - float((res - jac @ half) @ (res - jac @ half))) / n
        assert solution.predicted_reduction(0.5) == pytest.approx(actual_half, rel=1e-9)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_underdetermined_solve_uses_the_dual_form(backend: ArrayBackend) -> None:
    jac, res = _problem(6, 15, seed=1)
    n = 6
    lam = 0.05
    system = backend.system_from_slices(_slices(jac, res, 4), 6, 15)
    assert system.underdetermined and system.jacobian is not None
    u = torch.linalg.solve(jac @ jac.T / n + lam * torch.eye(n, dtype=torch.float64), res / n)
    solution = backend.solve(system, lam, "marquardt")  # scaling is I in the dual form
    assert solution is not None
    torch.testing.assert_close(solution.delta, jac.T @ u, rtol=1e-10, atol=1e-12)
    # The dual step equals the primal one with D = I (push-through identity).
    primal = torch.linalg.solve(
        jac.T @ jac / n + lam * torch.eye(15, dtype=torch.float64), jac.T @ res / n
    )
    torch.testing.assert_close(solution.delta, primal, rtol=1e-8, atol=1e-10)
    delta = solution.delta
    actual = (float(res @ res) - float((res - jac @ delta) @ (res - jac @ delta))) / n
    assert solution.predicted_reduction() == pytest.approx(actual, rel=1e-9)
    np.testing.assert_allclose(host_vector(system.gradient), (jac.T @ res / n).numpy())


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_float32_slices_are_solved_in_float64(backend: ArrayBackend) -> None:
    jac, res = _problem(50, 4, seed=2)
    system = backend.system_from_slices(_slices(jac.float(), res.float(), 50), 50, 4)
    solution = backend.solve(system, 1e-3, "identity")
    assert solution is not None and solution.delta.dtype == torch.float64


def _failed(solution: Solution | None) -> bool:
    """A rejected solve: ``None``, or a status (read from the device) that says failed."""
    return solution is None or read_values([solution.status])[0] != 0.0


def _system(backend: ArrayBackend, a: np.ndarray) -> LinearSystem:
    p = a.shape[0]
    products = NormalProducts(
        jtj=torch.from_numpy(a * 10), jtr=torch.ones(p, dtype=torch.float64), rss=1.0, rows=10
    )
    return backend.system_from_products(products)


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_indefinite_and_singular_systems_give_none(backend: ArrayBackend) -> None:
    indefinite = np.diag([1.0, -2.0, 3.0])
    assert _failed(backend.solve(_system(backend, indefinite), 1e-3, "identity"))
    # Damping large enough makes it positive definite: a solve, not an error.
    assert not _failed(backend.solve(_system(backend, indefinite), 10.0, "identity"))
    singular = np.zeros((3, 3))
    assert _failed(backend.solve(_system(backend, singular), 0.0, "identity"))
    # Marquardt scaling keeps a zero column damped (clamped D): solvable for λ > 0.
    assert not _failed(backend.solve(_system(backend, singular), 1e-3, "marquardt"))


@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_non_finite_systems_give_none(backend: ArrayBackend) -> None:
    for bad in (np.nan, np.inf):
        a = np.eye(3)
        a[0, 2] = a[2, 0] = bad
        assert _failed(backend.solve(_system(backend, a), 1e-3, "identity"))
        b = np.eye(3)
        b[1, 1] = bad
        assert _failed(backend.solve(_system(backend, b), 1e-3, "identity"))
    # An overflowing step (tiny pivots, huge right-hand side) is not finite either.
    tiny = np.eye(2) * 1e-300
    products = NormalProducts(
        jtj=torch.from_numpy(tiny),
        jtr=torch.full((2,), 1e300, dtype=torch.float64),
        rss=1.0,
        rows=1,
    )
    assert _failed(backend.solve(backend.system_from_products(products), 0.0, "identity"))


@pytest.mark.parametrize("shape", [(6, 15), (40, 5)], ids=["under", "over"])
@pytest.mark.parametrize("backend", BACKENDS, ids=IDS)
def test_jacobian_buffers_give_the_system_of_the_slices(
    backend: ArrayBackend, shape: tuple[int, int]
) -> None:
    """J written into the backend's own buffers gives the same system as streamed slices."""
    from marquardt.solver._backends.base import JacobianBuffers

    assert isinstance(backend, JacobianBuffers)
    jac, res = _problem(*shape, seed=4)
    jac_buf, res_buf = backend.jacobian_buffers(*shape, torch.float64)
    jac_buf.copy_(jac)
    res_buf.copy_(res)
    filled = backend.system_from_jacobian(jac_buf, res_buf)
    streamed = backend.system_from_slices(_slices(jac, res, 4), *shape)
    assert filled.underdetermined == streamed.underdetermined == (shape[0] < shape[1])
    for name in ("a", "g", "diag", "gradient"):
        np.testing.assert_allclose(
            np.asarray(host_vector(getattr(filled, name).reshape(-1))),
            np.asarray(host_vector(getattr(streamed, name).reshape(-1))),
            rtol=1e-12,
            atol=1e-14,
        )
    np.testing.assert_allclose(
        host_vector(filled.diag), (jac * jac).sum(0).numpy() / shape[0], rtol=1e-12
    )


def test_torch_solve_reads_nothing_back_from_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """δ, the model terms and the status stay on the backend's device: a solve converts
    no tensor to a Python number and copies nothing to the host."""
    backend = TorchBackend("cpu")
    calls: list[str] = []
    for shape in ((40, 5), (6, 15)):
        jac, res = _problem(*shape, seed=5)
        system = backend.system_from_matrix(jac, res)
        calls.clear()
        for name in ("item", "tolist", "__float__", "__bool__", "__int__", "cpu", "numpy"):
            original = getattr(torch.Tensor, name)

            def spy(
                self: torch.Tensor, *a: object, _n: str = name, _o: object = original
            ) -> object:
                calls.append(_n)
                return _o(self, *a)  # type: ignore[operator]

            monkeypatch.setattr(torch.Tensor, name, spy)
        # A tensor made from a Python number is a copy from the host: on CUDA, a wait.
        as_tensor = torch.tensor

        def from_host(*a: object, _make: Any = as_tensor, **k: object) -> torch.Tensor:
            calls.append("torch.tensor")
            return _make(*a, **k)  # type: ignore[no-any-return]

        monkeypatch.setattr(torch, "tensor", from_host)
        solution = backend.solve(system, 0.1, "marquardt")
        monkeypatch.undo()
        assert calls == []
        assert solution is not None
        for value in (solution.delta, solution.gradient_dot, solution.curvature, solution.status):
            assert isinstance(value, torch.Tensor) and value.device == backend.device
        assert read_values([solution.status]) == [0.0]


def test_numpy_solve_without_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    """SciPy is optional: NumPy's Cholesky and triangular solves give the same x."""
    rng = np.random.default_rng(3)
    m = rng.normal(size=(6, 6))
    a = m @ m.T + 6 * np.eye(6)
    b = rng.normal(size=6)
    monkeypatch.setitem(sys.modules, "scipy.linalg", None)
    x = cholesky_solve_numpy(a, b)
    assert x is not None
    np.testing.assert_allclose(a @ x, b, rtol=1e-10)
    assert cholesky_solve_numpy(-a, b) is None


def test_under_determined_system_needs_its_jacobian() -> None:
    with pytest.raises(ValueError, match="HINT"):
        LinearSystem(
            a=np.eye(2),
            g=np.ones(2),
            diag=np.ones(3),
            rows=2,
            params=3,
            underdetermined=True,
            rss=1.0,
        )


@pytest.mark.parametrize("shape", [(1200, 800), (800, 1200)], ids=["JtJ", "JJt"])
def test_numpy_solve_holds_one_damped_copy(shape: tuple[int, int]) -> None:
    """The damped matrix is factorised in place: a solve allocates one S × S array beside
    the system (it held two: the damped sum and its factor)."""
    import tracemalloc

    jac, res = _problem(*shape, seed=3)
    backend = NumpyBackend()
    system = backend.system_from_slices(_slices(jac, res, 400), shape[0], shape[1])
    side = min(shape)
    square = side * side * 8
    tracemalloc.start()
    try:
        solution = backend.solve(system, 0.1, "marquardt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert solution is not None
    assert square <= peak < 1.5 * square, f"peak {peak / square:.2f} S x S arrays"
