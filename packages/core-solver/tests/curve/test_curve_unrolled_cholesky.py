"""The written-out Cholesky factorisation and solve against torch's (LAPACK's)."""

from __future__ import annotations

import pytest
import torch

from marquardt.solver._curve.batched_lm.unrolled import (
    UNROLL_MOST,
    cholesky_ex,
    cholesky_solve,
    decompositions,
)


def _systems(size: int, fits: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(fits, size, size, generator=generator, dtype=torch.float64)
    a = a @ a.transpose(1, 2) + 0.1 * torch.eye(size, dtype=torch.float64)
    b = torch.randn(fits, size, 2, generator=generator, dtype=torch.float64)
    return a, b


@pytest.mark.parametrize("size", [1, 2, 5, 7])
def test_factor_and_solve_equal_torchs(size: int) -> None:
    a, b = _systems(size)
    factor, info = cholesky_ex(a)
    want, want_info = torch.linalg.cholesky_ex(a)
    assert torch.equal(info, want_info) and not bool(info.any())
    torch.testing.assert_close(factor, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        cholesky_solve(b, factor), torch.cholesky_solve(b, want), rtol=1e-9, atol=1e-10
    )
    upper, _ = cholesky_ex(a, upper=True)
    torch.testing.assert_close(upper, want.transpose(1, 2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        cholesky_solve(b, upper, upper=True), torch.cholesky_solve(b, want), rtol=1e-9, atol=1e-10
    )


def test_info_names_the_first_failing_minor_as_lapack_does() -> None:
    a, _ = _systems(5, fits=4)
    a[1] = -torch.eye(5, dtype=torch.float64)
    a[2, 3, 3] = -1.0
    a[3, 4, 4] = float("nan")
    _, info = cholesky_ex(a)
    _, want = torch.linalg.cholesky_ex(a)
    assert info.tolist() == want.tolist() == [0, 1, 4, 5]
    with pytest.raises(torch.linalg.LinAlgError):
        cholesky_ex(a, check_errors=True)


def test_only_small_systems_are_written_out() -> None:
    assert len(decompositions(UNROLL_MOST)) == 2
    assert decompositions(UNROLL_MOST + 1) == {}
